"""sapo's measurements. Each script runs from the repository root as `python -m bench.NAME`
(bench/README.md), so that the scripts and the tests import the shared modules by one name,
`bench.NAME`, with nothing put on sys.path by hand."""
