import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from fairstream.repair.hashing import keys_to_uint64, uniforms


@given(st.lists(st.text(min_size=1, max_size=12).filter(lambda t: "\x00" not in t), min_size=1, max_size=30))
def test_string_key_hash_does_not_depend_on_the_rest_of_the_batch(keys):
    together = keys_to_uint64(np.array(keys))
    alone = np.concatenate([keys_to_uint64(np.array([k])) for k in keys])
    np.testing.assert_array_equal(together, alone)


@given(st.lists(st.integers(-2**63, 2**63 - 1), min_size=1, max_size=50, unique=True), st.integers(0, 2**64 - 1))
def test_uniforms_are_a_function_of_seed_and_key(keys, seed):
    k = keys_to_uint64(np.array(keys, dtype=np.int64))
    u = uniforms(seed, k, 3)
    assert u.shape == (len(keys), 3)
    assert np.all((u >= 0) & (u < 1))
    perm = np.random.default_rng(0).permutation(len(keys))
    np.testing.assert_array_equal(uniforms(seed, k[perm], 3), u[perm])


def test_uniforms_are_uniform_and_streams_independent():
    u = uniforms(12345, keys_to_uint64(np.arange(100_000)), 2)
    assert stats.kstest(u[:, 0], "uniform").pvalue > 1e-3
    assert stats.kstest(u[:, 1], "uniform").pvalue > 1e-3
    assert abs(np.corrcoef(u[:, 0], u[:, 1])[0, 1]) < 0.02


def test_different_seeds_and_similar_keys_differ():
    k = keys_to_uint64(np.array(["id-1", "id-2", "1-di"]))
    assert len(set(k.tolist())) == 3
    assert not np.array_equal(uniforms(1, k, 1), uniforms(2, k, 1))
