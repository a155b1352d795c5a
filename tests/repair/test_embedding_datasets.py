"""Tests of the synthetic identity embeddings and of the embedding file loader."""


import sys

import numpy as np
import pytest

from fairstream.repair.validation import RepairInputError
from fairstream.repair.embedding_datasets import (
    EmbeddingSet,
    load_embeddings,
    save_embeddings,
    simulate_identity_embeddings,
    simulate_train_test,
)
from fairstream.repair.measure.verification import same_group_pair_scores


def small_split(seed=0):
    return simulate_train_test(train_identities=(20, 30), train_images=6, test_identities=(15, 15), test_images=4,
                               concentration=(0.3, 0.6), noise=(0.5, 0.9), dimension=16, seed=seed)


def test_simulation_shapes_units_disjoint_identities_and_seed():
    train, test = small_split()
    assert train.vectors.shape == (300, 16) and test.vectors.shape == (120, 16)
    np.testing.assert_allclose(np.linalg.norm(train.vectors, axis=1), 1.0)
    assert not set(train.identities) & set(test.identities)
    assert train.identity_counts() == {0: 20, 1: 30} and test.image_counts() == {0: 60, 1: 60}
    again, _ = small_split()
    np.testing.assert_array_equal(again.vectors, train.vectors)
    assert not np.array_equal(small_split(seed=1)[0].vectors, train.vectors)


def test_concentration_raises_impostor_scores_and_noise_lowers_genuine_scores():
    # Group 1 has the larger concentration (identities more alike) and the larger image noise.
    _, test = simulate_train_test(train_identities=(2, 2), test_identities=(60, 60), test_images=5,
                                  concentration=(0.3, 0.6), noise=(0.5, 0.9), dimension=32, seed=4)
    pairs = same_group_pair_scores(test.vectors, test.identities, test.groups, max_far=0.5)
    mean_gen = [pairs.genuine[pairs.genuine_group == g].mean() for g in (0, 1)]
    impostor_curves = [pairs.curves(g)[1] for g in (0, 1)]
    assert mean_gen[1] < mean_gen[0] - 0.1
    assert impostor_curves[1].far(0.2) > 2 * impostor_curves[0].far(0.2)


def test_generator_checks_its_arguments():
    directions = np.eye(2, 4)
    with pytest.raises(RepairInputError, match="one value per group"):
        simulate_identity_embeddings((3, 3), 2, directions, concentration=(0.1, 0.2, 0.3))
    with pytest.raises(RepairInputError, match="concentration must be in"):
        simulate_identity_embeddings((3, 3), 2, directions, concentration=(0.1, 1.5), noise=0.5)
    with pytest.raises(RepairInputError, match="positive identity count"):
        simulate_identity_embeddings((3, 0), 2, directions, concentration=0.3, noise=0.5)


def test_embedding_set_validation_and_identity_split():
    with pytest.raises(RepairInputError, match="more than one group"):
        EmbeddingSet(np.eye(3), identities=[1, 1, 2], groups=["a", "b", "b"])
    with pytest.raises(RepairInputError, match="non-finite"):
        EmbeddingSet([[np.inf, 0.0]], identities=[1], groups=[0])
    train, _ = small_split()
    fit, held_out = train.split_identities(0.25, seed=0)
    assert len(fit) + len(held_out) == len(train)
    assert not set(fit.identities) & set(held_out.identities)
    assert held_out.identity_counts() == {0: 5, 1: 8}


def test_npz_and_structured_npy_round_trip(tmp_path):
    data = EmbeddingSet(np.random.default_rng(0).normal(size=(5, 3)), identities=["u", "u", "v", "w", "w"],
                        groups=["g1", "g1", "g2", "g1", "g1"])
    back = load_embeddings(save_embeddings(data, tmp_path / "emb.npz"))
    np.testing.assert_array_equal(back.vectors, data.vectors)
    assert back.identities.tolist() == data.identities.tolist() and back.groups.tolist() == data.groups.tolist()
    table = np.zeros(5, dtype=[("emb", "f4", (3,)), ("person", "i8"), ("race", "U8")])
    table["emb"], table["person"], table["race"] = data.vectors, [1, 1, 2, 3, 3], data.groups
    np.save(tmp_path / "emb.npy", table)
    loaded = load_embeddings(tmp_path / "emb.npy", vector_column="emb", identity_column="person", group_column="race")
    np.testing.assert_allclose(loaded.vectors, data.vectors, rtol=1e-6)
    assert loaded.identities.tolist() == [1, 1, 2, 3, 3]


def test_loader_errors_name_the_problem(tmp_path):
    np.savez(tmp_path / "bad.npz", vector=np.zeros((2, 3)), identity=[1, 2])
    with pytest.raises(RepairInputError, match="no column 'group'"):
        load_embeddings(tmp_path / "bad.npz")
    with pytest.raises(RepairInputError, match="unsupported file type"):
        load_embeddings(tmp_path / "emb.csv")
    np.save(tmp_path / "plain.npy", np.zeros((2, 3)))
    with pytest.raises(RepairInputError, match="structured array"):
        load_embeddings(tmp_path / "plain.npy")


def test_parquet_without_pyarrow_says_what_is_missing(tmp_path, monkeypatch):
    # pyarrow comes with the models extra; a user who installed less gets a clear error.
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(RepairInputError, match="needs pyarrow"):
        load_embeddings(tmp_path / "emb.parquet")


def test_parquet_round_trip(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    vectors = np.random.default_rng(0).normal(size=(4, 3))
    pq.write_table(pa.table({"vector": list(vectors), "identity": [1, 1, 2, 2], "group": ["a", "a", "b", "b"]}),
                   tmp_path / "emb.parquet")
    data = load_embeddings(tmp_path / "emb.parquet")
    np.testing.assert_allclose(data.vectors, vectors)
    assert data.groups.tolist() == ["a", "a", "b", "b"]
