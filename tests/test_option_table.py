"""ddpbench.option_table: each option is registered where its flags say, and an option both the
plugin and a command take reads the same in both (one definition, two spellings)."""

import argparse

from _pytest.config.argparsing import Parser

from ddpbench import cli, option_table, plugin


def _pytest_options() -> dict:
    parser = Parser(_ispytest=True)
    plugin.pytest_addoption(parser)
    return {name: option.attrs() for group in parser._groups for option in group.options
            for name in option.names()}


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
