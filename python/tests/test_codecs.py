"""Codecs from Python: the Codec object, per-call keys and codecs, results equal on every rank, state per key."""

import copy
import pickle

import numpy as np
import pytest

import sparsereduce
from conftest import FAST, run_ranks


def test_codec_object_and_names():
    c = sparsereduce.Codec("3lc", sparsity=1.5, fp32_results=True)
    assert (c.name, c.sparsity, c.fp32_results) == ("3lc", 1.5, True)
    assert "3lc" in repr(c)
    with pytest.raises(sparsereduce.Error, match="unknown codec 'zip'"):
        sparsereduce.Worker(["127.0.0.1:1"], 1, 0, 1, codec="zip", **FAST)  # checked before connecting
    with pytest.raises(sparsereduce.Error, match="outside"):
        sparsereduce.Worker(["127.0.0.1:1"], 1, 0, 1, codec=sparsereduce.Codec("3lc", sparsity=2.5), **FAST)


def test_codec_is_a_value_that_pickles_and_compares():
    """A config holding a Codec reaches processes started by torch.multiprocessing.spawn, which pickles it (it
    raised TypeError), and two Codecs with the same settings are equal."""
    c = sparsereduce.Codec("diana", alpha=0.25, l2_norm=True)
    for copy_of_c in (pickle.loads(pickle.dumps(c)), copy.deepcopy(c), copy.copy(c)):
        assert copy_of_c == c and copy_of_c is not c
        assert repr(copy_of_c) == repr(c)
    assert sparsereduce.Codec("none") == sparsereduce.Codec("none")
    assert sparsereduce.Codec("topk", fraction=0.2) != sparsereduce.Codec("topk", fraction=0.3)


def test_fp16_sum_is_the_rounded_sum(aggregator, job):
    values = [np.linspace(-3, 3, 3000, dtype=np.float32) * (r + 1) + 0.1234567 for r in range(2)]

    def rank(r):
        with sparsereduce.Worker([aggregator], job, r, 2, codec="fp16", **FAST) as w:
            a = values[r].copy()
            w.allreduce(a)
            return a, w.last_stats.codec

    expected = (values[0].astype(np.float16).astype(np.float32) +
                values[1].astype(np.float16).astype(np.float32)).astype(np.float16).astype(np.float32)
    for a, codec in run_ranks(2, rank):
        assert codec == "fp16"
        np.testing.assert_array_equal(a, expected)


@pytest.mark.parametrize("name", ["3lc", "diana", "topk", "adaptive"])
def test_lossy_codecs_agree_across_ranks_and_keep_state_per_key(aggregator, job, new_job, name):
    rng = np.random.default_rng(5)
    inputs = [[rng.standard_normal(5000).astype(np.float32) for _ in range(3)] for _ in range(3)]
    codec = sparsereduce.Codec(name, fraction=0.2)

    def run(r, job_id, keys):
        """Three steps of tensor A under key 0, each followed by the other keys' tensors; key 0's results."""
        results, sent = [], []
        with sparsereduce.Worker([aggregator], job_id, r, 3, codec=codec, codec_seed=7, **FAST) as w:
            for step in range(3):
                for key in keys:
                    a = inputs[r][step] * (key + 1)
                    w.allreduce(a, key=key)
                    if key == 0:
                        results.append(a)
                    sent.append(w.last_stats.nonzero_blocks)
        return results, sent

    alone = run_ranks(3, lambda r: run(r, job, [0]))
    mixed_job = new_job()
    mixed = run_ranks(3, lambda r: run(r, mixed_job, [0, 1, 2]))
    for results, _ in alone[1:] + mixed:
        for a, b in zip(alone[0][0], results):
            assert np.isfinite(a).all() and np.abs(a).max() > 0
            if name != "adaptive":  # adaptive's k follows each run's own timings
                np.testing.assert_array_equal(a, b)  # every rank, and key 0 whatever else runs beside it
    for results, _ in mixed[1:]:
        for a, b in zip(mixed[0][0], results):
            np.testing.assert_array_equal(a, b)  # all ranks agree, adaptive too
    if name == "topk":
        assert all(s <= 4 for s in alone[0][1])  # at most 20 % of the 20 blocks


@pytest.mark.parametrize("codec", [sparsereduce.Codec("3lc"),
                                   sparsereduce.Codec("3lc", sparsity=1.5, fp32_results=True, tensor_scale=True),
                                   sparsereduce.Codec("diana", alpha=0.5, l2_norm=True),
                                   sparsereduce.Codec("topk", fraction=0.5)])
def test_int32_is_always_exact(aggregator, new_job, codec):
    """int32 sums go uncompressed whatever the Worker's codec and its codec-only options."""
    job = new_job()

    def rank(r):
        with sparsereduce.Worker([aggregator], job, r, 2, codec=codec, **FAST) as w:
            a = np.arange(1000, dtype=np.int32) * (r + 1)
            w.allreduce(a)
            return a, w.last_stats.codec

    for a, name in run_ranks(2, rank):
        np.testing.assert_array_equal(a, np.arange(1000, dtype=np.int32) * 3)
        assert name == "none"


@pytest.mark.parametrize("name", ["fp16", "bf16", "3lc", "diana", "topk", "adaptive"])
def test_empty_and_one_element_tensors_with_every_codec(aggregator, new_job, name):
    """Four steps (adaptive explores another k each step) of an empty tensor, then of one element, per key. An
    empty tensor with adaptive killed the process (SIGSEGV on the Worker's I/O thread)."""
    job = new_job()

    def rank(r):
        with sparsereduce.Worker([aggregator], job, r, 2, codec=name, **FAST) as w:
            shapes = []
            for step in range(4):
                empty = np.zeros(0, np.float32)
                w.allreduce(empty, key=1)
                one = np.array([0.5 * (r + 1)], np.float32)
                w.allreduce(one, key=2)
                shapes.append((empty.shape, one.shape, w.last_stats.codec))
            return shapes

    for shapes in run_ranks(2, rank):
        assert shapes == [((0,), (1,), name)] * 4


def test_int32_refuses_an_invalid_per_call_codec_and_stays_exact(aggregator, job):
    """A codec named per call is checked for int32 arrays as for float32 ones (it used to be dropped unchecked),
    and a valid one leaves the int32 sum exact."""
    with sparsereduce.Worker([aggregator], job, 0, 1, **FAST) as w:
        with pytest.raises(sparsereduce.Error, match="unknown codec 'zip'"):
            w.allreduce(np.ones(4, np.int32), codec="zip")
        with pytest.raises(sparsereduce.Error, match="outside"):
            w.allreduce(np.ones(4, np.int32), codec=sparsereduce.Codec("3lc", sparsity=2.5))
        a = np.arange(1000, dtype=np.int32)
        w.allreduce(a, key=5, codec="3lc")
        np.testing.assert_array_equal(a, np.arange(1000, dtype=np.int32))
        assert w.last_stats.codec == "none"


def test_ranks_with_different_codecs_fail_clearly(aggregator, job):
    def rank(r):
        with sparsereduce.Worker([aggregator], job, r, 2, codec="fp16" if r == 0 else "bf16", **FAST) as w:
            with pytest.raises(sparsereduce.Error) as raised:
                w.allreduce(np.ones(100, np.float32))
            return raised.value.code, str(raised.value)

    for code, message in run_ranks(2, rank):
        assert code == "SPEC_MISMATCH", message
        assert "codec=fp16" in message and "codec=bf16" in message, message


def test_codec_repr_shows_every_option():
    text = repr(sparsereduce.Codec("3lc", sparsity=1.5, tensor_scale=True))
    assert text.startswith("Codec('3lc', sparsity=1.5") and "tensor_scale=True" in text, text
    assert "tensor_scale=False" in repr(sparsereduce.Codec())
    assert repr(sparsereduce.Codec("topk", fraction=0.01)) == (
        "Codec('topk', sparsity=1, fp32_results=False, fraction=0.01, alpha=0, l2_norm=False, tensor_scale=False)")
