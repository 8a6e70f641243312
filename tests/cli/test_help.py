"""Every `harvester ... --help` prints that command's own help (issue 38, finding 5): the whole
argparse tree is walked, and each leaf, a command with no subcommands under it, is asked for its
help through ``main`` as a user asks. An action given as a positional choice (``harvester
embeddings invalidate`` before it was a subcommand) counts as a leaf too: its --help printed the
parent's help, which the walk catches."""
from __future__ import annotations

import argparse

import pytest

from harvester.cli.main import build_parser, main


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _positional_choices(parser: argparse.ArgumentParser) -> list[str]:
    return [str(choice) for action in parser._actions
            if not action.option_strings and action.choices and not isinstance(action, argparse._SubParsersAction)
            for choice in action.choices]


def leaves(parser: argparse.ArgumentParser | None = None, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The command lines (without ``harvester``) of every leaf under ``parser``."""
    parser = parser or build_parser()
    found: list[tuple[str, ...]] = []
    subcommands = _subcommands(parser)
    for name, sub in subcommands.items():
        found += leaves(sub, path + (name,))
    if not subcommands and path:
        choices = _positional_choices(parser)
        found += [path + (choice,) for choice in choices] if choices else [path]
    return found


LEAVES = leaves()


def test_the_walk_finds_the_leaves():
    assert len(LEAVES) > 30
    for leaf in (("embeddings", "invalidate"), ("embeddings", "reindex"), ("db", "start"), ("db", "url"),
                 ("export", "changes"), ("duplicates", "split"), ("validate",), ("harvest",)):
        assert leaf in LEAVES


@pytest.mark.parametrize("leaf", LEAVES, ids=" ".join)
def test_every_leafs_help_is_its_own(leaf, capsys):
    with pytest.raises(SystemExit) as exited:
        main([*leaf, "--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    usage = " ".join(shown.split("\n\n")[0].split())  # (argparse wraps a long usage)
    assert usage.startswith(f"usage: harvester {' '.join(leaf)} "), shown[:300]


def test_an_action_takes_its_options_after_it_or_before_it():
    """The command lines of the one parser of old still work: options after the action, or before."""
    parser = build_parser()
    after = parser.parse_args(["embeddings", "invalidate", "--portal", "canada"])
    before = parser.parse_args(["embeddings", "--portal", "canada", "invalidate"])
    for args in (after, before):
        assert (args.action, args.portal, args.dataset, args.model) == ("invalidate", "canada", None, None)
    reindex = parser.parse_args(["embeddings", "reindex", "--model", "m"])
    assert (reindex.action, reindex.model, reindex.portal) == ("reindex", "m", None)
    assert parser.parse_args(["embeddings", "--model", "m", "reindex"]).model == "m"
    url = parser.parse_args(["db", "url", "--resolve", "--redact"])
    assert (url.action, url.resolve, url.redact) == ("url", True, True)
    assert parser.parse_args(["db", "--redact", "url"]).redact is True
    assert parser.parse_args(["db", "start"]).resolve is False


def test_an_unknown_action_is_named(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["embeddings", "invalid"])
    assert exited.value.code == 2
    assert "invalid choice: 'invalid'" in capsys.readouterr().err
