import pytest

from sapo.node.cli import build_parser
from sapo.node.core.settings import SettingsError, field_owner, load_settings
from sapo.node.flags import settings_from_args


def test_paper_defaults():
    s = load_settings()
    assert s.training.generations == 8
    assert (s.training.eps_low, s.training.eps_high) == (0.2, 0.28)
    assert s.training.updates_per_batch == 2
    assert len(s.tasks.tasks) == 9
    assert s.model.model == "smollm2-135m"


def test_precedence_defaults_toml_env_cli(tmp_path):
    config = tmp_path / "node.toml"
    config.write_text("rounds = 7\nseed = 3\n[training]\nlr = 0.01\nmax_new_tokens = 64\n")
    s = load_settings(config_file=config)
    assert (s.run.rounds, s.run.seed, s.training.lr, s.training.max_new_tokens) == (7, 3, 0.01, 64)
    s = load_settings(config_file=config, environ={"SAPO_SEED": "4", "SAPO_LR": "0.02", "HOME": "/x"})
    assert (s.run.rounds, s.run.seed, s.training.lr) == (7, 4, 0.02)
    s = load_settings({"lr": "0.03"}, config_file=config, environ={"SAPO_LR": "0.02"})
    assert s.training.lr == 0.03 and s.run.rounds == 7


def test_cli_flags_reach_every_concern(tmp_path):
    args = build_parser().parse_args(
        [
            "start",
            "--model",
            "tiny",
            "--local",
            "2",
            "--external",
            "6",
            "--generations",
            "4",
            "--lora",
            "--tasks",
            "basic_arithmetic",
            "bf",
            "--peers",
            "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWLxXydXxaSwjPDk6SeRkMHtB2ZDM5V5N3948EbaK2eUiP",
            "--data-dir",
            str(tmp_path),
            "--task-weights",
            "bf=2",
            "--rounds",
            "5",
        ]
    )
    s = settings_from_args(args)
    assert s.model.model == "tiny" and s.model.lora
    assert (s.sampling.local, s.sampling.external, s.training.generations) == (2, 6, 4)
    assert s.tasks.tasks == ["basic_arithmetic", "bf"] and s.tasks.task_weights == {"bf": 2.0}
    assert s.network.peers == ["/ip4/127.0.0.1/tcp/1/p2p/12D3KooWLxXydXxaSwjPDk6SeRkMHtB2ZDM5V5N3948EbaK2eUiP"]
    assert s.run.data_dir == tmp_path and s.run.rounds == 5


def test_env_lists_and_dicts():
    s = load_settings(environ={"SAPO_TASKS": "bf,arc_1d", "SAPO_TASK_CONFIG": '{"bf": {"difficulty": 2}}'})
    assert s.tasks.tasks == ["bf", "arc_1d"]
    assert s.tasks.specs()[0].config == {"difficulty": 2}


@pytest.mark.parametrize(
    "given, message",
    [
        ({"lr": "-1"}, "--lr '-1' (command line)"),
        ({"generations": "1"}, "--generations"),
        ({"tasks": ["sudoku"]}, "unknown task"),
        ({"device": "auto", "rounds": "-3"}, "--rounds"),
        ({"bogus": 1}, "unknown setting 'bogus'"),
        ({"tasks": ["bf"], "task_weights": {"arc_1d": 1}}, "not in --tasks"),
    ],
)
def test_bad_values_name_the_setting(given, message):
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_settings(given)


def test_env_error_names_its_source():
    with pytest.raises(SettingsError, match=r"--generations 'zero' \(environment\)"):
        load_settings(environ={"SAPO_GENERATIONS": "zero"})


def test_bad_toml_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("rounds = = 3")
    with pytest.raises(SettingsError, match="not valid TOML"):
        load_settings(config_file=bad)
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings(config_file=tmp_path / "missing.toml")


def test_every_setting_has_a_unique_name_and_a_description():
    from sapo.node.core.settings import CONCERNS

    owner = field_owner()
    for concern, model in CONCERNS.items():
        for name, info in model.model_fields.items():
            assert owner[name] == concern
            assert info.description, f"{name} needs a description"


def test_help_lists_every_setting(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["start", "--help"])
    out = capsys.readouterr().out
    for name in field_owner():
        assert "--" + name.replace("_", "-") in out
