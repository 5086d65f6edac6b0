"""Settings parsing (UNISON_* with HOROVOD_* aliases) and dtype handling."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unison.config import SETTINGS_TABLE, Settings, load_settings
from unison.dtypes import DType, bfloat16_to_float32, check_supported, dtype_of, float32_to_bfloat16
from unison.errors import ConfigError, UnsupportedDtypeError
from unison.ops import CollectiveKind


def test_defaults_match_the_table() -> None:
    settings = load_settings({})
    for setting in SETTINGS_TABLE:
        assert getattr(settings, setting.field) == setting.default, setting.field
    assert settings == Settings()


def test_horovod_alias_and_unison_precedence() -> None:
    assert load_settings({"HOROVOD_FUSION_THRESHOLD": "1024"}).fusion_threshold_bytes == 1024
    both = {"HOROVOD_FUSION_THRESHOLD": "1024", "UNISON_FUSION_THRESHOLD": "2048"}
    assert load_settings(both).fusion_threshold_bytes == 2048
    assert load_settings({"HOROVOD_CYCLE_TIME": "5"}).cycle_time_seconds == pytest.approx(0.005)
    assert load_settings({"HOROVOD_LOG_LEVEL": "DEBUG"}).log_level == "debug"
    assert load_settings({"UNISON_STALL_CHECK_DISABLE": "1"}).stall_check_disable is True


@pytest.mark.parametrize(("var", "value", "expect"), [
    ("UNISON_CACHE_CAPACITY", "lots", "must be a non-negative integer"),
    ("HOROVOD_FUSION_THRESHOLD", "-1", "must be a non-negative integer"),
    ("UNISON_STALL_CHECK_TIME_SECONDS", "nan", "must be a non-negative number"),
    ("HOROVOD_LOG_LEVEL", "loud", "must be one of trace, debug"),
    ("UNISON_CONTROLLER", "carrier-pigeon", "must be one of mpi"),
    ("UNISON_DYNAMIC_PROCESS_SETS", "maybe", "must be 0 or 1"),
    ("HOROVOD_STALL_CHECK_DISABLE", "ture", r"must be 0 or 1 .*one of true, yes, on, false, no, off"),
    ("HOROVOD_LOG_LEVEL", "warm", r"must be one of .*\(also warn for warning, critical for fatal\)"),
])
def test_bad_values_name_the_variable_and_value(var: str, value: str, expect: str) -> None:
    with pytest.raises(ConfigError, match=f"{var} {expect}.*Got {var}='{value}'"):
        load_settings({var: value})


@pytest.mark.parametrize(("value", "level"), [
    ("WARN", "warning"), ("warn", "warning"), ("Warning", "warning"), ("TRACE", "trace"),
    ("critical", "fatal"), ("FATAL", "fatal"),
])
def test_log_levels_take_horovods_and_pythons_spellings(value: str, level: str) -> None:
    assert load_settings({"HOROVOD_LOG_LEVEL": value}).log_level == level


@pytest.mark.parametrize(("value", "on"), [
    ("TRUE", True), ("Yes", True), ("on", True), ("2", True), ("False", False), ("NO", False),
    ("off", False), ("0", False), ("", False),
])
def test_booleans_take_every_listed_spelling(value: str, on: bool) -> None:
    assert load_settings({"HOROVOD_STALL_CHECK_DISABLE": value}).stall_check_disable is on


def test_stall_shutdown_must_exceed_warning() -> None:
    with pytest.raises(ConfigError, match="at least UNISON_STALL_CHECK_TIME_SECONDS"):
        load_settings({"UNISON_STALL_CHECK_TIME_SECONDS": "10", "UNISON_STALL_SHUTDOWN_TIME_SECONDS": "5"})
    assert load_settings({"UNISON_STALL_SHUTDOWN_TIME_SECONDS": "0"}).stall_shutdown_seconds == 0


def test_keyword_overrides_and_unknown_names() -> None:
    assert load_settings({}, cache_capacity=3).cache_capacity == 3
    with pytest.raises(ConfigError, match="Unknown setting 'fusion'"):
        load_settings({}, fusion=1)


def test_dtype_support() -> None:
    assert dtype_of(np.zeros(1, np.int16)) is DType.INT16
    with pytest.raises(UnsupportedDtypeError, match="Tensor type complex64 is not supported. Supported types: uint8"):
        dtype_of(np.zeros(1, np.complex64))
    check_supported(CollectiveKind.ALLGATHER, DType.BOOL)
    with pytest.raises(UnsupportedDtypeError, match="allreduce does not support dtype bool"):
        check_supported(CollectiveKind.ALLREDUCE, DType.BOOL)


def test_a_non_native_byte_order_is_refused_at_submission() -> None:
    # The same dtype name in the other byte order: accepted, MPI read its bytes as native on this rank
    # alone (its buffer refused, or worse, read swapped) while the peers waited in the collective.
    swapped = np.zeros(2, np.dtype(np.float64).newbyteorder("S"))
    with pytest.raises(UnsupportedDtypeError, match=r"non-native byte order.*newbyteorder\('='\)"):
        dtype_of(swapped)
    assert dtype_of(swapped.astype(swapped.dtype.newbyteorder("="))) is DType.FLOAT64
    assert dtype_of(np.zeros(2, np.dtype(np.uint8).newbyteorder("S"))) is DType.UINT8  # one byte: no order


@given(st.lists(st.floats(width=32, allow_nan=False), max_size=50))
def test_bfloat16_round_trip_is_nearest_even(values) -> None:
    x = np.array(values, dtype=np.float32)
    bits = float32_to_bfloat16(x)
    back = bfloat16_to_float32(bits)
    # exact for values already representable; otherwise within half a bfloat16 ulp
    again = bfloat16_to_float32(float32_to_bfloat16(back))
    np.testing.assert_array_equal(again, back)
    finite = np.isfinite(back)
    tol = np.maximum(np.abs(x[finite]) * 2.0**-8, 2.0**-133)  # subnormals: absolute half-ulp
    assert (np.abs(back[finite] - x[finite]) <= tol).all()


def test_bfloat16_nan_stays_nan() -> None:
    assert np.isnan(bfloat16_to_float32(float32_to_bfloat16(np.array([np.nan], np.float32))))[0]


def test_configuration_doc_matches_the_settings_table() -> None:
    from pathlib import Path

    from unison.config import settings_markdown

    doc = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    start = doc.index("-->\n", doc.index("<!-- settings-table")) + 4
    end = doc.index("<!-- end settings-table -->")
    assert doc[start:end] == settings_markdown(), "regenerate docs/configuration.md from settings_markdown()"
