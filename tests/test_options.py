"""One definition per option (issue #51 item 5): `gpuproof run`'s and `gpuproof plan`'s options that pytest takes
too, and the plugin's, come from one table (gpuproof/plugin/options.py): the same help, the same check, and what the
command line hands to pytest reads back as it was given."""

from __future__ import annotations

import argparse

import pytest
from _pytest.config.argparsing import Parser

from gpuproof.cli.main import build_parser
from gpuproof.cli.run import pytest_argv
from gpuproof.errors import GpuproofError
from gpuproof.plugin import options


def pytest_parser() -> Parser:
    parser = Parser(processopt=lambda opt: None, _ispytest=True)
    options.add_to_pytest(parser.getgroup("gpuproof", "gpuproof target and run"))
    return parser


def actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def test_the_commands_options_are_the_plugins_with_its_help():
    group = pytest_parser().getgroup("gpuproof")
    plugin = {o.names()[0]: o for o in group.options}
    assert [n.removeprefix("--gpuproof-") for n in plugin] == [o.name for o in options.OPTIONS]
    for o in options.OPTIONS:
        opt = plugin[f"--gpuproof-{o.name}"]
        assert opt.names() == [f"--gpuproof-{o.name}", f"--{o.name}"] and opt.attrs()["help"] == o.help
    for command, kinds in (("run", (options.TARGET, options.RUN, options.SELECT)),
                           ("plan", (options.TARGET, options.SELECT))):
        given = actions(subparser(command))
        for o in options.cli_options(*kinds):
            assert given[f"--{o.name}"].help == o.help and given[f"--{o.name}"].dest == o.dest, (command, o.name)
    shared = {o.name for o in options.cli_options(options.TARGET, options.RUN, options.SELECT)}
    assert {"kubeconfig", "context", "fleet", "report-dir", "run-id", "parallel", "progress-after",
            "api-deadline", "strict-taints", "quick-bench"} <= shared
    assert not shared & {"sim-port", "lease-wait", "no-lease", "timeout-scale"}       # pytest's only


def test_what_run_hands_to_pytest_reads_back_as_given():
    given = ["run", "--context", "prod", "--fleet", "minimal", "--pool-label", "pool", "--strict-taints",
             "--parallel", "4", "--progress-after", "0", "--api-deadline", "2.5", "--shared-requests-refused", "l4"]
    args = build_parser().parse_args(given)
    argv = pytest_argv(args, "rid")
    forwarded = [a for a in argv if a.split("=")[0] in {f"--{o.name}" for o in options.OPTIONS}]
    parsed = pytest_parser().parse(forwarded)
    for dest in ("context", "fleet", "pool_label", "strict_taints", "shared_requests_refused", "api_deadline",
                 "progress_after"):
        assert getattr(parsed, dest) == getattr(args, dest), dest
    assert parsed.parallel == "4" and parsed.run_id == "rid" and parsed.report_dir == "reports"
    assert "--progress-after=0" in argv                   # 0 (off) is a value, handed on
    bare = pytest_argv(build_parser().parse_args(["run"]), "rid")
    assert not [a for a in bare if a.split("=")[0] in {"--parallel", "--progress-after", "--api-deadline",
                                                       "--strict-taints", "--kubeconfig"}]


@pytest.mark.parametrize("name, value, message", [
    ("parallel", "none", "--parallel takes a whole number of pods in flight (1 or more), got 'none'"),
    ("parallel", "0", "--parallel must be 1 or more pods in flight, got 0"),
    ("progress-after", -1.0, "--progress-after must be 0 (off) or more seconds, got -1"),
    ("api-deadline", 0.0, "--api-deadline must be more than 0 seconds, got 0"),
])
def test_one_check_per_option_for_the_command_and_the_plugin(name, value, message):
    o = options.BY_NAME[name]
    args = argparse.Namespace(**{p.dest: None for p in options.OPTIONS})
    setattr(args, o.dest, value)
    with pytest.raises(GpuproofError) as cli:
        options.check_args(args, options.RUN)
    config = type("Config", (), {"getoption": lambda self, dest, default=None: getattr(args, dest, default)})()
    with pytest.raises(GpuproofError) as plugin:
        options.check_config(config)
    assert str(cli.value) == str(plugin.value) == message
