"""Identity-labelled embedding sets: a biased synthetic generator and a loader for your own vectors.

Face images and face-recognition backbones are not shipped with the project, so the embedding
fairness module is developed on synthetic identity embeddings on the unit sphere whose per-group
statistics are biased the way real ones are (the simulation design used to check Conti and
Clémençon, "Mitigating Bias in Facial Recognition Systems: Centroid Fairness Loss Optimization", 2024):

- an identity of group ``a`` has centre ``c = normalise(rho_a * b_a + sqrt(1 - rho_a^2) * u)``, with
  ``b_a`` a random group direction and ``u`` uniform on the sphere. A larger *concentration*
  ``rho_a`` makes the group's identities more alike, so its impostor scores and FAR are higher;
- an image is ``e = normalise(c + sigma_a * xi / sqrt(d))`` with ``xi ~ N(0, I_d)``. A larger
  *noise* ``sigma_a`` lowers the group's genuine scores, so its FRR is higher.

Train and test identities are disjoint (open-set evaluation, as in face verification).

Your own embeddings load from ``.npz`` (arrays named by the column names), ``.npy`` (a structured
array with those fields) or, when ``pyarrow`` is installed, ``.parquet`` (a list column of vectors
plus identity and group columns). ``pyarrow`` is not a dependency of the project.

>>> train, test = simulate_train_test(train_identities=(30, 20), test_identities=(10, 10),
...                                   concentration=(0.4, 0.5), noise=(0.7, 0.7), dimension=16, seed=0)
>>> train.vectors.shape, test.vectors.shape, bool(set(train.identities) & set(test.identities))
((1000, 16), (200, 16), False)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .validation import RepairInputError, as_2d, as_labels, check_finite, normalise_labels

__all__ = [
    "DEFAULT_CONCENTRATION",
    "DEFAULT_NOISE",
    "EmbeddingSet",
    "load_embeddings",
    "save_embeddings",
    "simulate_identity_embeddings",
    "simulate_train_test",
]

DEFAULT_CONCENTRATION = (0.42, 0.50, 0.35, 0.45)
"""Per-group identity concentration rho_a of the synthetic data (group 2 is the least biased)."""
DEFAULT_NOISE = (0.73, 0.71, 0.67, 0.75)
"""Per-group image noise sigma_a of the synthetic data."""


@dataclass(eq=False)  # arrays make field-wise == ambiguous
class EmbeddingSet:
    """Embedding ``vectors`` (n, d) with the ``identities`` and ``groups`` of each vector.

    Every identity belongs to exactly one group (the attribute is per identity). Labels may be
    integers or strings.

    >>> es = EmbeddingSet([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], identities=[7, 7, 8], groups=["a", "a", "b"])
    >>> len(es), es.dimension, es.identity_counts()
    (3, 2, {'a': 1, 'b': 1})
    """

    vectors: np.ndarray
    identities: np.ndarray
    groups: np.ndarray
    name: str = "embeddings"

    def __post_init__(self) -> None:
        self.vectors = as_2d(self.vectors)
        check_finite(self.vectors, [f"v{k}" for k in range(self.vectors.shape[1])])
        n = self.vectors.shape[0]
        self.identities = normalise_labels(as_labels(self.identities, n, "identities"))
        self.groups = normalise_labels(as_labels(self.groups, n, "groups"))
        _check_one_group_per_identity(self.identities, self.groups)

    def __len__(self) -> int:
        return self.vectors.shape[0]

    def __repr__(self) -> str:
        return (f"EmbeddingSet(name={self.name!r}, n={len(self)}, d={self.dimension}, "
                f"identities={np.unique(self.identities).size}, groups={self.group_labels.tolist()})")

    @property
    def dimension(self) -> int:
        """Length d of the vectors."""
        return int(self.vectors.shape[1])

    @property
    def group_labels(self) -> np.ndarray:
        """The distinct groups, sorted."""
        return np.unique(self.groups)

    def identity_counts(self) -> dict:
        """Number of distinct identities per group."""
        return {_plain(g): int(np.unique(self.identities[self.groups == g]).size) for g in self.group_labels}

    def image_counts(self) -> dict:
        """Number of vectors per group."""
        labels, counts = np.unique(self.groups, return_counts=True)
        return {_plain(g): int(c) for g, c in zip(labels, counts)}

    def subset(self, rows) -> EmbeddingSet:
        """The rows selected by a slice, an index array or a boolean mask."""
        return EmbeddingSet(self.vectors[rows], self.identities[rows], self.groups[rows], self.name)

    def split_identities(self, test_fraction: float = 0.25, seed=None) -> tuple[EmbeddingSet, EmbeddingSet]:
        """(train, test) with disjoint identities, about ``test_fraction`` of each group's identities in test."""
        if not 0 < test_fraction < 1:
            raise RepairInputError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
        rng = np.random.default_rng(seed)
        test_ids = []
        for g in self.group_labels:
            ids = np.unique(self.identities[self.groups == g])
            if ids.size < 2:
                raise RepairInputError(f"group {_plain(g)!r} has {ids.size} identity; a split needs two")
            k = min(max(1, round(test_fraction * ids.size)), ids.size - 1)
            test_ids.append(rng.choice(ids, size=k, replace=False))
        in_test = np.isin(self.identities, np.concatenate(test_ids))
        return self.subset(~in_test), self.subset(in_test)


def _plain(label):
    return label.item() if hasattr(label, "item") else label


def _check_one_group_per_identity(identities: np.ndarray, groups: np.ndarray) -> None:
    if identities.size == 0:
        raise RepairInputError("an embedding set needs at least one vector")
    _, id_codes = np.unique(identities, return_inverse=True)
    _, g_codes = np.unique(groups, return_inverse=True)
    first = np.full(id_codes.max() + 1, -1)
    first[id_codes[::-1]] = g_codes[::-1]  # the group of each identity's first vector
    bad = np.flatnonzero(first[id_codes] != g_codes)
    if bad.size:
        i = bad[0]
        raise RepairInputError(f"identity {_plain(identities[i])!r} appears in more than one group "
                               f"(e.g. {_plain(groups[i])!r} at row {i}); the group must be per identity")


# --------------------------------------------------------------------------------------------
# Synthetic biased identity embeddings
# --------------------------------------------------------------------------------------------


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _per_group(values, n_groups: int, name: str) -> np.ndarray:
    arr = np.broadcast_to(np.asarray(values, dtype=np.float64), (n_groups,)) if np.ndim(values) == 0 \
        else np.asarray(values, dtype=np.float64)
    if arr.shape != (n_groups,):
        raise RepairInputError(f"{name} needs one value per group ({n_groups}), got {arr.shape[0]}")
    return arr


def simulate_identity_embeddings(identities_per_group: Sequence[int], images_per_identity: int,
                                 group_directions, concentration=DEFAULT_CONCENTRATION, noise=DEFAULT_NOISE,
                                 seed=None, first_identity: int = 0, name: str = "synthetic") -> EmbeddingSet:
    """Fresh identities of each group drawn around the given group directions (see the module docstring).

    ``group_directions`` is (n_groups, d); identities are numbered from ``first_identity`` and groups
    are 0..n_groups-1.
    """
    b = _unit(np.asarray(group_directions, dtype=np.float64))
    n_groups, d = b.shape
    counts = np.asarray(identities_per_group, dtype=np.int64)
    if counts.shape != (n_groups,) or np.any(counts < 1) or int(images_per_identity) < 1:
        raise RepairInputError(f"need a positive identity count per group ({n_groups}) and images_per_identity >= 1")
    rho = _per_group(concentration, n_groups, "concentration")
    sigma = _per_group(noise, n_groups, "noise")
    if np.any((rho < 0) | (rho > 1)) or np.any(sigma < 0):
        raise RepairInputError("concentration must be in [0, 1] and noise >= 0")
    rng = np.random.default_rng(seed)
    group_of_identity = np.repeat(np.arange(n_groups), counts)
    r = rho[group_of_identity][:, None]
    centres = _unit(r * b[group_of_identity] + np.sqrt(1 - r ** 2) * _unit(rng.standard_normal((counts.sum(), d))))
    m = int(images_per_identity)
    identity = np.repeat(np.arange(counts.sum()), m)
    xi = rng.standard_normal((identity.size, d))
    vectors = _unit(centres[identity] + sigma[group_of_identity[identity]][:, None] * xi / np.sqrt(d))
    return EmbeddingSet(vectors, identity + int(first_identity), group_of_identity[identity], name)


def simulate_train_test(train_identities: Sequence[int] = (300, 250, 600, 200), train_images: int = 20,
                        test_identities: Sequence[int] = (400, 400, 400, 400), test_images: int = 10,
                        concentration=DEFAULT_CONCENTRATION, noise=DEFAULT_NOISE, dimension: int = 64,
                        seed=None) -> tuple[EmbeddingSet, EmbeddingSet]:
    """Biased (train, test) embedding sets sharing group directions, with disjoint identities.

    Defaults: d = 64, four groups, imbalanced training identities (300/250/600/200 x 20 images)
    and a balanced test set (400 per group x 10 images, about 8 million same-group impostor pairs
    per group, so the threshold at FAR 1e-5 rests on ~320 false accepts).
    """
    if len(train_identities) != len(test_identities):
        raise RepairInputError("train_identities and test_identities need one count per group each")
    rng = np.random.default_rng(seed)
    directions = rng.standard_normal((len(train_identities), int(dimension)))
    train = simulate_identity_embeddings(train_identities, train_images, directions, concentration, noise,
                                         seed=rng, name="synthetic-train")
    test = simulate_identity_embeddings(test_identities, test_images, directions, concentration, noise, seed=rng,
                                        first_identity=int(np.sum(train_identities)), name="synthetic-test")
    return train, test


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def save_embeddings(data: EmbeddingSet, path: str | os.PathLike) -> Path:
    """Write an ``.npz`` with arrays ``vector``, ``identity`` and ``group`` (loadable without pickle)."""
    path = Path(path)
    if path.suffix != ".npz":
        raise RepairInputError(f"save_embeddings writes .npz files, got {path.name!r}")
    np.savez(path, vector=data.vectors, identity=data.identities, group=data.groups)
    return path


def load_embeddings(path: str | os.PathLike, vector_column: str = "vector", identity_column: str = "identity",
                    group_column: str = "group") -> EmbeddingSet:
    """Load vectors with their identity and group from ``.npz``, structured ``.npy`` or ``.parquet``.

    Files are read without pickle. A parquet file needs ``pyarrow`` (installed with the models extra);
    its vector column holds one list of floats per row.
    """
    path = Path(path)
    columns = (vector_column, identity_column, group_column)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as npz:
            arrays = [_column(npz, c, path, list(npz.files)) for c in columns]
    elif suffix == ".npy":
        table = np.load(path, allow_pickle=False)
        fields = list(table.dtype.names or ())
        if not fields:
            raise RepairInputError(f"{path.name}: a .npy file must hold a structured array with fields {columns}")
        arrays = [_column(table, c, path, fields) for c in columns]
    elif suffix == ".parquet":
        arrays = _read_parquet(path, columns)
    else:
        raise RepairInputError(f"{path.name}: unsupported file type {suffix!r} (use .npz, .npy or .parquet)")
    return EmbeddingSet(np.asarray(arrays[0], dtype=np.float64), arrays[1], arrays[2], name=path.stem)


def _column(source, name: str, path: Path, available: list[str]) -> np.ndarray:
    if name not in available:
        raise RepairInputError(f"{path.name} has no column {name!r} (found: {available})")
    return np.asarray(source[name])


def _read_parquet(path: Path, columns: tuple[str, str, str]) -> list[np.ndarray]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise RepairInputError(f"{path.name}: reading parquet needs pyarrow, which is not installed; "
                               "install it or convert the file to .npz") from None
    table = pq.read_table(path)
    for name in columns:
        if name not in table.column_names:
            raise RepairInputError(f"{path.name} has no column {name!r} (found: {table.column_names})")
    vectors = table.column(columns[0]).to_pylist()
    return [np.array(vectors, dtype=np.float64),
            table.column(columns[1]).to_numpy(zero_copy_only=False),
            table.column(columns[2]).to_numpy(zero_copy_only=False)]
