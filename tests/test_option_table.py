"""ddpbench.option_table: each option is registered where its flags say, and an option both the
plugin and a command take reads the same in both (one definition, one spelling with the plugin's
prefix); an old spelling still works, hidden, and says so once."""

import argparse

import pytest
from _pytest.config.argparsing import Parser

from ddpbench import cli, option_table, plugin


def _pytest_options(hidden: bool = False) -> dict:
    """The plugin's options by flag: those ``pytest --help`` shows, or with ``hidden`` the others."""
    parser = Parser(_ispytest=True)
    plugin.pytest_addoption(parser)
    return {name: option.attrs() for group in parser._groups for option in group.options
            for name in option.names() if (option.attrs().get("help") == argparse.SUPPRESS) == hidden}


def _command_actions() -> dict[str, dict[str, argparse.Action]]:
    """Command name -> its options' actions by flag."""
    commands = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {name: {flag: action for action in sub._actions for flag in action.option_strings}
            for name, sub in commands.choices.items()}


def _table() -> list:
    return [option for group in option_table.PLUGIN_GROUPS for option in group.options] + [option_table.STORAGE]


def test_the_plugin_registers_every_option_of_its_groups_and_no_other():
    flags = [option.pytest_flag for group in option_table.PLUGIN_GROUPS for option in group.options]
    assert len(flags) == len(set(flags)) and None not in flags
    assert set(_pytest_options()) == set(flags)


def test_an_option_with_both_spellings_reads_alike_in_plugin_and_command():
    pytest_options, commands = _pytest_options(), _command_actions()
    shared = [option for option in _table() if option.command_flag]
    assert {option.command_flag for option in option_table.GATE_OPTIONS} <= set(commands["compare"])
    for option in shared:
        takers = [actions[option.command_flag] for actions in commands.values() if option.command_flag in actions]
        assert takers, f"no ddpbench command takes {option.command_flag}"
        for action in takers:
            assert (action.help, action.default, action.type) == (option.help, option.default
                                                                   if option.takes_value else False, option.type)
            if option.pytest_flag:
                attrs = pytest_options[option.pytest_flag]
                assert (attrs["help"], attrs["default"], attrs.get("type")) == (action.help, action.default,
                                                                                 action.type)


def test_an_option_both_take_is_one_spelling_with_the_plugins_prefix():
    # pytest: --dist-WORDS; a command: --WORDS (as pytest-benchmark's --benchmark-X and its CLI's --X).
    both = [option for option in _table() if option.pytest_flag and option.command_flag]
    assert len(both) == 8
    for option in both:
        assert option.pytest_flag == "--dist-" + option.command_flag[2:], option


# Each old spelling: what it reads as now, and the one-line notice naming the new spelling.
OLD_PYTEST_SPELLINGS = [
    (["--dist-ab-allow-missing"], "dist_allow_missing", True, "--dist-allow-missing"),
    (["--dist-ab-allow-baseline-failure"], "dist_allow_baseline_failure", True, "--dist-allow-baseline-failure"),
    (["--dist-ab-accept-structure-change"], "dist_accept_structure_change", True, "--dist-accept-structure-change"),
    (["--dist-ab-accept-memory-change"], "dist_accept_memory_change", True, "--dist-accept-memory-change"),
    (["--dist-ab-memory-tolerance=5%"], "dist_memory_tolerance", 0.05, "--dist-memory-tolerance"),
    (["--dist-ab-accept-numerics-change"], "dist_accept_numerics_change", True, "--dist-accept-numerics-change"),
    (["--dist-ab-numerics-tolerance", "1%"], "dist_numerics_tolerance", 0.01, "--dist-numerics-tolerance"),
    (["--dist-ab-fail-on-inconclusive"], "dist_fail_on_inconclusive", True, "--dist-fail-on-inconclusive"),
    (["--dist-min-time=0.5"], "dist_max_time", 0.5, "--dist-max-time"),
    (["--dist-ab-stratify-placement"], "dist_ab_stratify_cpu_sharing", True, "--dist-ab-stratify-cpu-sharing"),
    (["--dist-memory-census=off"], "dist_census", ("collectives",), "--dist-census=collectives"),
    (["--dist-memory-census=on"], "dist_census", ("collectives", "memory"), "--dist-census=collectives,memory"),
    (["--dist-census=off"], "dist_census", ("memory",), "--dist-census=memory"),
    (["--dist-census=on"], "dist_census", ("collectives", "memory"), "--dist-census=collectives,memory"),
    (["--dist-memory-census=off", "--dist-census=off"], "dist_census", (), "--dist-census=none"),
]


@pytest.mark.parametrize("argv, dest, value, new", OLD_PYTEST_SPELLINGS, ids=lambda v: str(v))
def test_an_old_pytest_spelling_still_works_and_says_so_once(argv, dest, value, new):
    parser = Parser(_ispytest=True)
    plugin.pytest_addoption(parser)
    namespace = parser.parse(argv + argv[:1] if "=" in argv[0] else argv)  # given twice: said once
    assert getattr(namespace, dest) == value
    notices = option_table.old_spelling_notices(namespace)
    assert notices[-1].endswith(f" is now {new} (the old spelling still works, for one more release)")
    assert len(notices) == len({word.split("=")[0] for word in argv if word.startswith("--")})
    old = {word.split("=")[0] for word in argv if word.startswith("--")} - {"--dist-census"}  # its old words
    assert not old & set(_pytest_options())  # not in pytest --help


def test_the_old_pytest_spellings_are_hidden_and_every_one_is_tested():
    hidden = set(_pytest_options(hidden=True))
    assert hidden == {spelling.flag for spelling in option_table.PYTEST_OLD_SPELLINGS}
    assert hidden == {argv[0].split("=")[0] for argv, *_ in OLD_PYTEST_SPELLINGS} - {"--dist-census"}


def test_a_run_says_each_old_spelling_once_in_its_summary(pytester):
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--dist-ab-allow-missing", "--dist-min-time=2",
                                           "--dist-memory-census=off", timeout=60)
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    for old, new in (("--dist-ab-allow-missing", "--dist-allow-missing"), ("--dist-min-time", "--dist-max-time"),
                     ("--dist-memory-census=off", "--dist-census=collectives")):
        assert out.count(f"ddpbench: {old} is now {new} (the old spelling still works") == 1, out


@pytest.mark.parametrize("argv, dest, value, new", [
    (["report", "--no-charts"], "no_chart", True, "--no-chart"),
    (["report", "--charts", "out"], "chart", "out", "--chart"),
    (["census", "--precision", "bf16"], "precision", "bf16", "--dtype"),
])
def test_an_old_command_spelling_still_works_and_says_so_once(capsys, argv, dest, value, new):
    args = cli.parse_args(argv)
    assert getattr(args, dest) == value
    err = capsys.readouterr().err
    assert err == (f"ddpbench: {argv[1]} is now {new} (the old spelling still works, for one more release)\n")
    commands = _command_actions()
    assert argv[1] in commands[argv[0]] and new in commands[argv[0]]
    assert commands[argv[0]][argv[1]].help == argparse.SUPPRESS  # not in --help or the reference


def test_census_report_and_compare_spell_the_chart_one_way():
    commands = _command_actions()
    for name in ("census", "report", "compare"):
        shown = {flag for flag, action in commands[name].items() if action.help != argparse.SUPPRESS}
        assert "--chart" in shown and not {"--charts", "--no-charts"} & shown
    assert {"--no-chart"} <= set(commands["census"]) & set(commands["report"])
    assert "--dtype" in commands["census"] and "--precision" not in {
        flag for flag, action in commands["census"].items() if action.help != argparse.SUPPRESS}
