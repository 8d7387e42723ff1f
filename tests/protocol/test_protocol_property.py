"""Property-style: random batches come back unchanged through every pair of inverse operations.

Each seed builds a batch with random keys, tensor dtypes (NaN in the float ones), object columns
(strings, ints, NaN floats, ragged lists, numpy arrays, dicts, mixed) and meta_info (numpy arrays,
NaN, nested dicts, metrics); B = seed % 9, so empty batches are among them.
"""

import pickle

import numpy as np
import pytest
from protocol_helpers import assert_same, random_batch

from roll_ma.protocol import DataProto

SEEDS = range(45)


@pytest.mark.parametrize("seed", SEEDS)
def test_chunk_then_concat(seed):
    d = random_batch(seed)
    for n in (1, 2, 3, 7):  # 7 > B for most seeds: empty pieces too
        assert_same(DataProto.concat(d.chunk(n)), d)


@pytest.mark.parametrize("seed", SEEDS)
def test_split_then_concat(seed):
    d = random_batch(seed)
    for size in (1, 2, 5):
        assert_same(DataProto.concat(d.split(size)), d)


@pytest.mark.parametrize("seed", SEEDS)
def test_select_idxs_then_union(seed):
    """Two overlapping column subsets, rows shuffled the same way, joined by union and put back in order."""
    d = random_batch(seed)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(d))
    tensors, columns = list(d.batch.keys()), list(d.non_tensor)
    left_t = [k for k in tensors if rng.random() < 0.6]
    left_o = [k for k in columns if rng.random() < 0.6]
    right_t = [k for k in tensors if k not in left_t or rng.random() < 0.5]  # shared keys must agree
    right_o = [k for k in columns if k not in left_o or rng.random() < 0.5]
    left = d.select(left_t, left_o).select_idxs(perm)
    right = d.select(right_t, right_o).select_idxs(perm)
    assert_same(left.union(right).select_idxs(np.argsort(perm)), d)
    assert_same(d.union(pickle.loads(pickle.dumps(d))), d)  # NaN everywhere still equals itself


@pytest.mark.parametrize("seed", SEEDS)
def test_pad_then_unpad(seed):
    d = random_batch(seed)
    for n in (1, 3, 4):
        padded, pad_size = d.pad_to_multiple(n)
        assert len(padded) % n == 0 and len(padded) == len(d) + pad_size
        assert_same(padded.unpad(pad_size), d)


@pytest.mark.parametrize("seed", SEEDS)
def test_conversions_and_reorder_come_back(seed, tmp_path):
    d = random_batch(seed)
    assert_same(DataProto.from_tensordict(d.to_tensordict()), d)
    d.save_to_disk(tmp_path / "d.pkl")
    assert_same(DataProto.load_from_disk(tmp_path / "d.pkl"), d)
    perm = np.random.default_rng(seed).permutation(len(d))
    assert_same(d.select().reorder(perm).reorder(np.argsort(perm)), d)
    assert_same(d.sample_level_repeat(np.ones(len(d), dtype=np.int64)), d)
