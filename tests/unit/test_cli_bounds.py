"""Bad numbers on the command line are refused by argparse, naming the option (each was a traceback, a
silent default or a run of zeros, found by trying the commands as a new user would)."""

from __future__ import annotations

import pytest

from dlb.cli import build_parser, main


@pytest.mark.parametrize(("argv", "said"), [
    (["sim", "--experiment", "baseline", "--seed", "-3"], "argument --seed: must be an integer >= 0, got -3"),
    (["demo", "--seed", "-1"], "argument --seed: must be an integer >= 0, got -1"),
    (["bfio", "study", "--generations", "1"], "argument --generations: must be > 1"),
    (["bfio", "study", "--G", "0"], "argument --G: expected comma-separated integers >= 1, got '0'"),
    (["bfio", "study", "--B", "16,-8"], "argument --B: expected comma-separated integers >= 1"),
    (["bfio", "study", "--H", "-1"], "argument --H: expected comma-separated integers >= 0"),
    (["bfio", "bench", "--picks", "0"], "argument --picks: must be an integer >= 1, got 0"),
    (["bfio", "bench", "--G", "0"], "argument --G: must be an integer >= 1, got 0"),
    (["bfio", "placement", "--generations", "0.5"], "argument --generations: must be > 1"),
    (["bench", "pick", "--decisions", "-5"], "argument --decisions: must be an integer >= 1, got -5"),
    (["bench", "overhead", "--duration", "-1"], "argument --duration: must be a finite number > 0, got -1"),
])
def test_a_bad_number_is_refused_naming_the_option(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser(argv).parse_args(argv)
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--quick"], ["--trials", "2"], ["--scenarios", "steady"]])
def test_a_compare_option_without_compare_is_refused(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """They were ignored and a full single demo ran instead."""
    assert main(["demo", *flags]) == 1
    assert "only with --compare" in capsys.readouterr().err


def test_a_bad_otlp_endpoint_is_refused_before_dlb_up_starts_anything(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["up", "--config", "envoy_configs/dlb.example.yaml", "--otlp-endpoint", "nonsense"]) == 1
    assert "--otlp-endpoint: 'nonsense' is not host:port" in capsys.readouterr().err
