import pytest
import torch

from sapo.training.models import devices
from sapo.training.models.devices import available_devices, resolve_device


@pytest.fixture
def machine(monkeypatch):
    """Pretend the machine has `cuda` GPUs and MPS or not."""

    def set_up(cuda: int = 0, mps: bool = False):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda)
        monkeypatch.setattr(devices, "_mps_available", lambda: mps)

    return set_up


def test_auto_prefers_cuda_then_mps_then_cpu(machine):
    machine(cuda=2, mps=True)
    assert resolve_device("auto") == torch.device("cuda", 0)
    machine(cuda=0, mps=True)
    assert resolve_device("auto") == torch.device("mps", 0)
    machine(cuda=0, mps=False)
    assert resolve_device("auto") == torch.device("cpu")


def test_auto_on_this_machine_is_usable():
    device = resolve_device("auto")
    assert torch.zeros(1, device=device).device == device


def test_explicit_names(machine):
    machine(cuda=2, mps=False)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert available_devices() == ["cuda:0", "cuda:1", "cpu"]


def test_missing_cuda_says_what_is_available(machine):
    machine(cuda=0, mps=True)
    for name in ("cuda", "cuda:0"):
        with pytest.raises(ValueError, match=r"CUDA.*not available.*available: mps, cpu"):
            resolve_device(name)


def test_cuda_index_out_of_range(machine):
    machine(cuda=1)
    with pytest.raises(ValueError, match=r"'cuda:1'.*1 CUDA device.*available: cuda:0, cpu"):
        resolve_device("cuda:1")


def test_mps(machine):
    machine(cuda=0, mps=True)
    assert resolve_device("mps") == torch.device("mps", 0)
    machine(cuda=0, mps=False)
    with pytest.raises(ValueError, match=r"MPS.*not available.*available: cpu"):
        resolve_device("mps")


@pytest.mark.parametrize("name", ["gpu", "", "cuda:x", "meta", "xpu"])
def test_unknown_names_list_the_choices(name):
    with pytest.raises(ValueError, match="choose auto, cpu, cuda, cuda:N or mps"):
        resolve_device(name)


def test_owned_cpus_reads_the_affinity_and_a_cgroup_quota(tmp_path, monkeypatch):
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
    assert devices.owned_cpus(str(tmp_path)) == 6  # no cgroup files: the affinity mask
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert devices.owned_cpus(str(tmp_path)) == 6  # no quota
    (tmp_path / "cpu.max").write_text("250000 100000\n")  # --cpus 2.5
    assert devices.owned_cpus(str(tmp_path)) == 3
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")  # cgroup v1, half a core
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert devices.owned_cpus(str(tmp_path)) == 1


def test_torch_threads_are_set_once_for_the_process():
    import subprocess
    import sys

    # a child process: the setting is process-wide, so a test must not change the suite's own
    code = (
        "import torch\nfrom sapo.training.models.devices import configure_torch_threads, owned_cpus\n"
        "print(configure_torch_threads(3), torch.get_num_threads(), configure_torch_threads(0), "
        "torch.get_num_threads(), owned_cpus())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    given, set_to, default, default_set, owned = map(int, out)
    assert (given, set_to) == (3, 3)
    assert default == default_set == owned  # 0: one thread per core this process may use


def test_a_process_that_configured_torch_reuses_freed_memory_without_page_faults():
    import subprocess
    import sys

    # Allocating, touching and freeing a 128 MB tensor, then a 64 MB one: by default glibc maps
    # each afresh, so the second faults in every page again; configured, it reuses the freed memory.
    # (The first is larger because torch's aligned allocation asks for a little more than the
    # tensor: a freed block of the same size may not hold it, and whether it does depends on where
    # the interpreter's small allocations fell in between.)
    code = (
        "import resource, sys, torch\nfrom sapo.training.models.devices import configure_torch_threads\n"
        "if sys.argv[1] == 'configured':\n    configure_torch_threads(1)\n"
        "torch.ones(32 * 2**20)\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "torch.ones(16 * 2**20)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n"
    )
    faults = {
        arm: int(subprocess.run([sys.executable, "-c", code, arm], capture_output=True, text=True, check=True).stdout)
        for arm in ("default", "configured")
    }
    assert faults["default"] > 10_000  # 64 MB in 4 kB pages, faulted in again
    assert faults["configured"] < 1_000, faults
