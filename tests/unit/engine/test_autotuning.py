"""The autotuner at run time: its state, the change rank 0 sends once, what every rank applies, the log."""

from __future__ import annotations

import pytest

from unison.config import load_settings
from unison.engine.autotuning import Autotuning, open_tune_log
from unison.errors import ConfigError
from unison.ops import Kind
from unison.protocol.autotune import LOG_COLUMNS, AutotuneState, Parameters, Proposal, read_tune_response


def test_off_without_the_setting_and_no_statistics() -> None:
    tuning = Autotuning(load_settings({}), rank=0)
    assert tuning.state is AutotuneState.OFF and tuning.state == "off"
    assert tuning.statistics() is None and not tuning.measuring and not tuning.due
    assert tuning.parameters == Parameters(128 * 1024 * 1024, 0.0, 4 * 1024 * 1024, True)


def test_only_rank_0_measures() -> None:
    settings = load_settings({}, autotune=True)
    assert Autotuning(settings, rank=0).measuring
    assert not Autotuning(settings, rank=1).measuring
    assert Autotuning(settings, rank=1).statistics().state is AutotuneState.TUNING  # type: ignore[union-attr]


def test_apply_moves_the_state_and_returns_the_replaced_parameters() -> None:
    tuning = Autotuning(load_settings({}, autotune=True), rank=1)
    start = tuning.parameters
    trial = Parameters(1024, 0.002, 4096, False)
    assert tuning.apply(Proposal(trial, final=False)) == start
    assert (tuning.state, tuning.parameters, tuning.changes) == (AutotuneState.TUNING, trial, 1)
    assert tuning.apply(Proposal(start, final=True)) == trial
    stats = tuning.statistics()
    assert stats is not None and (stats.state, stats.parameters, stats.changes) == ("settled", start, 2)


def test_a_change_received_while_off_starts_tuning() -> None:
    tuning = Autotuning(load_settings({}), rank=1)
    tuning.apply(Proposal(tuning.parameters, final=False))
    assert tuning.state is AutotuneState.TUNING


def test_rank_0_measures_samples_and_sends_each_change_once(tmp_path) -> None:
    path = str(tmp_path / "tune.csv")
    settings = load_settings({}, autotune=True, autotune_warmup_samples=0, autotune_steps_per_sample=1,
                             autotune_max_samples=2)
    tuning = Autotuning(settings, rank=0, tune_log=open_tune_log(path))
    tuning.measure(1000, 0.0, restart=False)  # one sample: the search proposes its next point
    assert tuning.due
    response = tuning.take_due()
    assert response is not None and response.kind is Kind.TUNE
    assert tuning.take_due() is None and not tuning.due
    proposal = read_tune_response(response)
    tuning.apply(proposal)
    tuning.measure(5000, 0.0, restart=True)  # the cycle that applied it belongs to no sample
    tuning.close()
    lines = open(path, encoding="utf-8").read().splitlines()
    assert lines[0] == ",".join(LOG_COLUMNS) and len(lines) == 2


def test_an_unwritable_log_names_the_setting(tmp_path) -> None:
    with pytest.raises(ConfigError, match="UNISON_AUTOTUNE_LOG must name a file rank 0 can write"):
        open_tune_log(str(tmp_path / "missing" / "tune.csv"))
