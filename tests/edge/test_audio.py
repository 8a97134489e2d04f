"""Judging a decode against its reference: SNR, or a peak error negligible against full scale."""

import numpy as np
import pytest

from vllm_omni.edge.audio import match_reference, peak_error_dbfs, snr_db

EXACT_DB = 90.0


def _noise(rms: float, samples: int = 4096, seed: int = 0) -> np.ndarray:
    return (rms * np.random.default_rng(seed).standard_normal(samples)).astype(np.float32)


def test_a_near_silent_reference_with_a_rounding_sized_error_matches():
    reference = _noise(1e-9)
    estimate = reference + _noise(1e-9, seed=1)  # float32 rounding of O(1) activations, as a correct graph gives
    match = match_reference(reference, estimate, EXACT_DB)
    assert match.snr_db < 10  # SNR alone would call the graph wrong
    assert match.error_dbfs < -160 and match.max_abs < 1e-8
    assert match.passed


def test_a_near_silent_reference_with_an_audible_error_does_not_match():
    reference = _noise(1e-9)
    match = match_reference(reference, reference + _noise(1e-3, seed=1), EXACT_DB)
    assert not match.passed
    assert -60 < match.error_dbfs < -40  # peak of 1e-3 RMS noise: about -50 dBFS, far over -90 dBFS


def test_a_loud_reference_with_a_low_snr_does_not_match_though_its_error_is_small_against_full_scale():
    reference = _noise(0.1)
    estimate = reference + _noise(1e-5, seed=1)  # 80 dB SNR, peak error about -86 dBFS
    match = match_reference(reference, estimate, EXACT_DB)
    assert 79 < match.snr_db < 81 and -90 < match.error_dbfs < -80
    assert not match.passed


def test_a_loud_reference_with_a_high_snr_matches_and_an_identical_decode_matches_at_any_bar():
    reference = _noise(0.1)
    assert match_reference(reference, reference + _noise(1e-7, seed=1), EXACT_DB).passed
    identical = match_reference(reference, reference.copy(), 1e9)
    assert identical.passed and identical.snr_db == float("inf") and identical.max_abs == 0.0


def test_the_full_scale_allowance_is_the_bar_in_dbfs():
    reference = np.zeros(8, dtype=np.float32)
    at_bar = reference.copy()
    at_bar[3] = 10 ** (-EXACT_DB / 20) * (1 - 1e-6)
    over_bar = reference.copy()
    over_bar[3] = 10 ** (-EXACT_DB / 20) * (1 + 1e-3)
    assert match_reference(reference, at_bar, EXACT_DB).passed
    assert not match_reference(reference, over_bar, EXACT_DB).passed
    assert peak_error_dbfs(reference, over_bar) == pytest.approx(-EXACT_DB, abs=0.01)
    assert snr_db(reference, over_bar) == float("-inf")  # an all-zero reference: no signal, no warning


def test_the_description_names_both_numbers_and_the_rule():
    reference = _noise(1e-9)
    match = match_reference(reference, reference + _noise(1e-3, seed=1), EXACT_DB)
    assert "SNR" in match.describe() and "dBFS" in match.describe() and "max abs" in match.describe()
    assert match.bar() == ">= 90 dB SNR, or a peak error <= -90 dBFS (max abs 3.16e-05)"
    assert match.to_json() == {"snr_db": match.snr_db, "max_abs_diff": match.max_abs}
