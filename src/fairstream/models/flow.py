"""The frozen AdapFair flow preprocessor: invertible maps of the features in front of a frozen scorer.

AdapFair (Huang, Tang and Chang, "AdapFair: Ensuring Adaptive Fairness for Machine Learning
Operations", 2025) repairs a classifier it may not retrain by transforming its *inputs*: a
normalizing flow ``T_s`` per group (group-aware) or one shared ``T`` (attribute-blind) is fitted so
that the classifier's score distribution no longer depends on the group (see
:mod:`fairstream.models.flow_training`). At serving time a record goes ``x -> T_s(x) -> scorer``.

Each flow is a stack of masked affine coupling layers (RealNVP): with a binary mask ``m``,
``z -> m*z + (1-m)*(z*exp(s(m*z)) + t(m*z))``, where ``s`` (tanh output) and ``t`` are small MLPs.
Layers come in complementary pairs (``m``, ``1-m``), so every feature is transformed. The flow
acts on standardised features (fit-time mean and scale) and maps back to feature units, so the
scorer sees values on the scale it was trained on. The map is a bijection: :meth:`inverse_transform`
undoes it exactly.

This module is numpy-only: a worker applies a flow artifact without importing torch. Every
product is computed row by row (:func:`~fairstream.repair.protocol.rowwise_matmul`), so a
record's output is bit-identical in any batch; that is the cost: on a Health-sized flow (11
features, 20 coupling layers of 3 x 20 units, one thread) a 1,000-row batch takes about 20 ms,
against 7 ms for one batched matmul per layer (and for torch inference mode, which is batched,
so not batch-independent). Both coupling nets of a layer share one product per row (their later
layers as one block-diagonal matrix), and tanh is computed from exp (numpy's float64 tanh is
slow without AVX-512).

>>> import numpy as np
>>> flow = FlowPreprocessor.identity(["age", "income"], groups=[0, 1], n_blocks=2, hidden=(4,))
>>> X = np.array([[30.0, 1.5], [60.0, 0.5]])
>>> bool(np.allclose(flow.transform(X, s=[0, 1]), X))
True
>>> flow.apply(Batch(X=X, keys=np.array(["a", "b"]), s=np.array([0, 7]))).reasons[1]
's value 7 has no flow (the flow was fitted for groups [0, 1])'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from fairstream.repair import artifacts
from fairstream.repair.array_layout import (
    ArrayLayout,
    ArraySpec,
    Check,
    above,
    check_arrays,
    finite,
    int_parameter,
    names_parameter,
    nonempty,
    not_nan,
    one_of,
    sizes_parameter,
    sorted_labels,
)
from fairstream.repair.measure.metrics import as_binary
from fairstream.repair.protocol import (
    Applied,
    Batch,
    Capabilities,
    IncompatibleArtifact,
    PipelineSchema,
    check_labels_cover,
    rowwise_matmul,
)
from fairstream.repair.validation import (
    RepairInputError,
    as_2d,
    as_labels,
    column_names,
    encode_mask,
    normalise_labels,
)

__all__ = ["FlowPreprocessor", "FlowValidation", "coupling_masks", "validate_flow"]

ARTIFACT_KIND = "flow"
_CHUNK_ROWS = 2048  # rows mapped per pass: bounds the layers' intermediate arrays for huge batches
_LARGEST = np.finfo(np.float64).max
NETS = ("scale", "shift")


def coupling_masks(n_features: int, n_blocks: int, seed: int = 0) -> np.ndarray:
    """Binary masks (2 * n_blocks, n_features): per block a random half and its complement.

    >>> coupling_masks(4, 1, seed=0).sum(axis=0).tolist()  # each feature is transformed once per block
    [1.0, 1.0, 1.0, 1.0]
    """
    rng = np.random.default_rng(seed)
    masks = np.zeros((2 * n_blocks, n_features))
    for block in range(n_blocks):
        kept = rng.permutation(n_features)[: n_features // 2]
        masks[2 * block, kept] = 1.0
        masks[2 * block + 1] = 1.0 - masks[2 * block]
    return masks


@dataclass(frozen=True, eq=False)
class FlowPreprocessor:
    """One frozen coupling flow per group (``group_aware``) or one shared flow, as plain arrays.

    ``scale_weights[j]`` has shape (n_flows, n_layers, out, in) and ``scale_biases[j]`` (n_flows,
    n_layers, out) for the j-th linear layer of the scale MLPs; likewise for the shift MLPs.
    ``groups`` are the sorted group labels: flow ``k`` serves group ``groups[k]`` when the flow is
    group-aware; a blind flow keeps the groups it was fitted on as provenance only.

    Parameters
    ----------
    columns : tuple of str
        Feature names, in order.
    groups : ndarray of shape (n_groups,)
        Sorted group labels; flow ``k`` serves ``groups[k]`` when ``group_aware``.
    group_aware : bool
        One flow per group (True) or one shared flow (False).
    mean : ndarray of shape (n_features,)
        Standardisation centre, in feature units.
    scale : ndarray of shape (n_features,)
        Standardisation scale, in feature units.
    masks : ndarray of shape (n_layers, n_features)
        Coupling mask of each layer (1: the features the layer conditions on).
    scale_weights : tuple of ndarray
        Weights of the scale MLPs, ``scale_weights[j]`` of shape (n_flows, n_layers, out, in).
    scale_biases : tuple of ndarray
        Biases of the scale MLPs, ``scale_biases[j]`` of shape (n_flows, n_layers, out).
    shift_weights : tuple of ndarray
        Weights of the shift MLPs, shaped as ``scale_weights``.
    shift_biases : tuple of ndarray
        Biases of the shift MLPs, shaped as ``scale_biases``.
    data_min : ndarray of shape (n_features,)
        Smallest training value of each feature.
    data_max : ndarray of shape (n_features,)
        Largest training value of each feature.
    named : bool, default=True
        Whether ``columns`` were given by name (False: numbered from a feature count).
    training : dict, default={}
        Provenance: how the flow was trained (JSON).
    """

    columns: tuple[str, ...]
    groups: np.ndarray
    group_aware: bool
    mean: np.ndarray
    scale: np.ndarray
    masks: np.ndarray
    scale_weights: tuple[np.ndarray, ...]
    scale_biases: tuple[np.ndarray, ...]
    shift_weights: tuple[np.ndarray, ...]
    shift_biases: tuple[np.ndarray, ...]
    data_min: np.ndarray
    data_max: np.ndarray
    named: bool = True
    training: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Read-only float64 views: the fused weights cached by _fused must never go stale.
        for name in ("mean", "scale", "masks", "data_min", "data_max", "groups"):
            object.__setattr__(self, name, _frozen(getattr(self, name), name != "groups"))
        for name in ("scale_weights", "scale_biases", "shift_weights", "shift_biases"):
            object.__setattr__(self, name, tuple(_frozen(a, True) for a in getattr(self, name)))
        object.__setattr__(self, "columns", tuple(self.columns))
        _check_shapes(self)

    # ------------------------------------------------------------------ construction

    @classmethod
    def identity(cls, columns: Sequence[str] | int, groups: Sequence = (0, 1), group_aware: bool = True,
                 n_blocks: int = 10, hidden: Sequence[int] = (20, 20), mean=None, scale=None,
                 seed: int = 0) -> "FlowPreprocessor":
        """A flow that maps every row to itself (zero output layers), e.g. the first version of a pipeline.

        Parameters
        ----------
        columns : sequence of str or int
            Feature names, or the number of features.
        groups : sequence, default=(0, 1)
            Group labels.
        group_aware : bool, default=True
            One flow per group (True) or one shared flow.
        n_blocks : int, default=10
            Number of coupling layers.
        hidden : sequence of int, default=(20, 20)
            Hidden layer widths of the scale and shift MLPs.
        mean : array-like of shape (n_features,) or None, default=None
            Standardisation centre; None is 0.
        scale : array-like of shape (n_features,) or None, default=None
            Standardisation scale; None is 1.
        seed : int, default=0
            Seed of the masks and of the (inert) hidden weights.

        Returns
        -------
        FlowPreprocessor
            The identity flow.
        """
        named = not isinstance(columns, (int, np.integer))
        names = column_names(int(columns), None) if not named else [str(c) for c in columns]
        d = len(names)
        groups = np.unique(normalise_labels(np.asarray(list(groups))))
        n_flows = len(groups) if group_aware else 1
        masks = coupling_masks(d, n_blocks, seed)
        sizes = [d, *[int(h) for h in hidden], d]
        nets = {}
        rng = np.random.default_rng(seed + 1)
        for net in NETS:
            weights = [rng.normal(0.0, 1.0 / np.sqrt(n_in), size=(n_flows, len(masks), n_out, n_in))
                       for n_in, n_out in zip(sizes[:-1], sizes[1:])]
            weights[-1][:] = 0.0  # a zero last layer: s = t = 0, the identity map
            nets[net] = (tuple(weights), tuple(np.zeros(w.shape[:-1]) for w in weights))
        mean = np.zeros(d) if mean is None else np.asarray(mean, dtype=np.float64)
        scale = np.ones(d) if scale is None else np.asarray(scale, dtype=np.float64)
        return cls(columns=tuple(names), groups=groups, group_aware=group_aware, mean=mean, scale=scale,
                   masks=masks, scale_weights=nets["scale"][0], scale_biases=nets["scale"][1],
                   shift_weights=nets["shift"][0], shift_biases=nets["shift"][1],
                   data_min=np.full(d, -np.inf), data_max=np.full(d, np.inf), named=named)

    # ------------------------------------------------------------------ shape

    @property
    def n_features(self) -> int:
        """Number of features the flow maps."""
        return len(self.columns)

    @property
    def n_flows(self) -> int:
        """Number of flows: one per group when group-aware, else 1."""
        return int(self.scale_weights[0].shape[0])

    @property
    def n_blocks(self) -> int:
        """Number of blocks, each a pair of complementary coupling layers."""
        return self.masks.shape[0] // 2

    @property
    def hidden(self) -> tuple[int, ...]:
        """Hidden layer sizes of the coupling MLPs."""
        return tuple(int(w.shape[2]) for w in self.scale_weights[:-1])

    # ------------------------------------------------------------------ the map

    def _flow_index(self, s, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Which flow serves each row, and which rows' groups have none (blind: flow 0 for all)."""
        if not self.group_aware:
            return np.zeros(n, dtype=np.intp), np.zeros(n, dtype=bool)
        if s is None:
            return np.zeros(n, dtype=np.intp), np.ones(n, dtype=bool)
        return encode_mask(normalise_labels(as_labels(s, n, "s")), self.groups)

    def _fused(self) -> list:
        """Per flow and layer, both nets' weights arranged for few, large numpy calls (built once).

        The first linear layers of the scale and shift nets share their input, so they are one
        (d, 2h) matrix; the later ones are one block-diagonal (2 in, 2 out) matrix, so both nets
        take one product per row (products are row by row, where the count of calls is the cost).
        """
        cached = self.__dict__.get("_fused_cache")
        if cached is None:
            cached = [[self._fuse(k, layer) for layer in range(len(self.masks))] for k in range(self.n_flows)]
            object.__setattr__(self, "_fused_cache", cached)
        return cached

    def _fuse(self, k: int, layer: int) -> list:
        pairs = [(sw[k, layer], sb[k, layer], tw[k, layer], tb[k, layer]) for sw, sb, tw, tb in
                 zip(self.scale_weights, self.scale_biases, self.shift_weights, self.shift_biases)]
        first = pairs[0]
        fused = [(np.ascontiguousarray(np.concatenate([first[0], first[2]]).T), np.concatenate([first[1], first[3]]))]
        for sw, sb, tw, tb in pairs[1:]:
            (n_out, n_in) = sw.shape
            both = np.zeros((2 * n_in, 2 * n_out))
            both[:n_in, :n_out], both[n_in:, n_out:] = sw.T, tw.T
            fused.append((both, np.concatenate([sb, tb])))
        return fused

    def _map(self, Z: np.ndarray, k: int, inverse: bool) -> np.ndarray:
        """Flow ``k`` (or its inverse) on standardised rows ``Z``."""
        fused = self._fused()[k]
        d = Z.shape[1]
        order = range(len(self.masks) - 1, -1, -1) if inverse else range(len(self.masks))
        for layer in order:
            mask = self.masks[layer]
            kept = Z * mask
            h = None
            for w, b in fused[layer]:  # (n, 2 units): the scale net's units, then the shift net's
                if h is not None:
                    np.maximum(h, 0.0, out=h)
                h = rowwise_matmul(kept if h is None else h, w)  # row by row: independent of the batch
                h += b
            log_scale, shift = _tanh(h[:, :d]), h[:, d:]
            moved = (Z - shift) * np.exp(-log_scale) if inverse else Z * np.exp(log_scale) + shift
            Z = kept + (1.0 - mask) * moved
        return Z

    def _run(self, X: np.ndarray, flow: np.ndarray, rows: np.ndarray, inverse: bool) -> np.ndarray:
        out = X.copy()
        for k in range(self.n_flows):
            pick = rows[flow[rows] == k]
            for start in range(0, len(pick), _CHUNK_ROWS):
                part = pick[start:start + _CHUNK_ROWS]
                out[part] = self._map((X[part] - self.mean) / self.scale, k, inverse) * self.scale + self.mean
        return out

    def _reasons(self, X: np.ndarray, s, finite: np.ndarray, unknown: np.ndarray, mapped: np.ndarray) -> list:
        reasons: list = [None] * len(X)
        for i in np.flatnonzero(~finite | unknown | ~np.isfinite(mapped).all(axis=1)):
            if not finite[i]:
                col = int(np.argmax(~np.isfinite(X[i])))
                reasons[i] = f"column {self.columns[col]!r} has a non-finite value {float(X[i, col])!r}"
            elif not unknown[i]:
                col = int(np.argmax(~np.isfinite(mapped[i])))
                reasons[i] = (f"the flow maps column {self.columns[col]!r} of the row to {float(mapped[i, col])!r} "
                              "(its values overflow the flow, far outside the range it was fitted on)")
            elif s is None:
                reasons[i] = "the flow is group-aware and the row has no s"
            else:
                value = np.asarray(s)[i]
                value = value.item() if hasattr(value, "item") else value
                reasons[i] = f"s value {value!r} has no flow (the flow was fitted for groups {self.groups.tolist()})"
        return reasons

    def map_rows(self, X, s=None, inverse: bool = False) -> Applied:
        """``T_s`` (or its inverse) on every row that has a flow; the others keep their values and get a reason."""
        X = as_2d(X, n_features=self.n_features, columns=self.columns)
        n = len(X)
        flow, unknown = self._flow_index(s, n)
        finite = np.isfinite(X).all(axis=1)
        ok = finite & ~unknown
        with np.errstate(over="ignore", invalid="ignore"):  # an overflowing row is refused below, not warned about
            values = self._run(X, flow, np.flatnonzero(ok), inverse)
        mapped = np.isfinite(values).all(axis=1)
        reasons = self._reasons(X, s, finite, unknown, values) if not (ok & mapped).all() else [None] * n
        if not mapped[ok].all():  # rare: a refused row keeps its input values
            overflowed = ok & ~mapped
            values[overflowed], ok = X[overflowed], ok & mapped
        with np.errstate(invalid="ignore"):
            outside = ((X < self.data_min) | (X > self.data_max)).any(axis=1) & ok
        return Applied(X=values, ok=ok, reasons=reasons, out_of_range=outside)

    def transform(self, X, s=None) -> np.ndarray:
        """``T_s(x)`` for every row (a 1-D ``X`` is one row); raises naming the first row it cannot map.

        Parameters
        ----------
        X : array-like of shape (n_rows, n_features)
            Features.
        s : array-like of shape (n_rows,) or None, default=None
            Group of each row; needed by a group-aware flow.

        Returns
        -------
        ndarray of shape (n_rows, n_features)
            The mapped rows, in feature units.
        """
        result = self.map_rows(X, s)
        if not result.ok.all():
            raise RepairInputError(result.reasons[int(np.argmin(result.ok))])
        return result.X

    def inverse_transform(self, X, s=None) -> np.ndarray:
        """``T_s^{-1}(x)``: undoes :meth:`transform` (to rounding).

        Parameters
        ----------
        X : array-like of shape (n_rows, n_features)
            Mapped features.
        s : array-like of shape (n_rows,) or None, default=None
            Group of each row; needed by a group-aware flow.

        Returns
        -------
        ndarray of shape (n_rows, n_features)
            The original rows (to rounding).
        """
        result = self.map_rows(X, s, inverse=True)
        if not result.ok.all():
            raise RepairInputError(result.reasons[int(np.argmin(result.ok))])
        return result.X

    # ------------------------------------------------------------------ module protocol

    kind = ARTIFACT_KIND
    capabilities = Capabilities(agent="records", reads=frozenset({"features"}), writes=frozenset({"features"}),
                                place="repair", needs_s=True, needs_labels=True)
    seed = ""  # no random draws

    def check_compatible(self, schema: PipelineSchema) -> None:
        """Refuse a flow whose features (count, names) or groups do not match the pipeline's."""
        if schema.features and self.n_features != len(schema.features):
            raise IncompatibleArtifact(f"the flow maps {self.n_features} features {list(self.columns)}, "
                                       f"the pipeline has {len(schema.features)} {list(schema.features)}")
        if schema.features and self.named and tuple(self.columns) != tuple(schema.features):
            raise IncompatibleArtifact(f"the flow was fitted on features {list(self.columns)}, "
                                       f"the pipeline names {list(schema.features)}")
        if self.group_aware:  # a blind flow never reads s, so any groups will do
            check_labels_cover("flow", "groups", self.groups.tolist(), schema.groups)

    def apply(self, batch: Batch) -> Applied:
        """The module protocol: the mapped features; rows without a flow (unknown s, NaN) or overflowing it: reasons."""
        return self.map_rows(batch.X, batch.s)

    def probe(self) -> Batch:
        """The module protocol's load-time probe: per flow, the standardisation centre and the fit range's corners
        (three scales from the centre where the range is unbounded)."""
        with np.errstate(over="ignore"):  # mean +- 3 scale may overflow: clipped to the largest float
            low = np.where(np.isfinite(self.data_min), self.data_min, self.mean - 3.0 * self.scale)
            high = np.where(np.isfinite(self.data_max), self.data_max, self.mean + 3.0 * self.scale)
            rows = np.clip(np.stack([self.mean, low, high]), -_LARGEST, _LARGEST)
        groups = self.groups[:self.n_flows]  # a blind flow reads no s: any label will do
        X = np.tile(rows, (len(groups), 1))
        return Batch(X=X, keys=np.array([f"probe-{i}" for i in range(len(X))], dtype=object),
                     s=np.repeat(groups, len(rows)), columns=self.columns)

    # ------------------------------------------------------------------ artifacts

    def artifact_parameters(self) -> dict:
        """The manifest parameters: feature names, mode, architecture and training provenance.

        Not ``get_params``: a flow is a fitted result, not an estimator (scikit-learn's clone would try to rebuild
        it from them); :class:`~fairstream.models.flow_training.AdapFair` fits it.
        """
        return {"columns": list(self.columns) if self.named else None, "group_aware": bool(self.group_aware),
                "n_blocks": self.n_blocks, "hidden": list(self.hidden), "training": dict(self.training)}

    def to_artifact(self, version: int = 1, metrics: dict | None = None,
                    data_fingerprint: str | None = None) -> artifacts.Artifact:
        """Freeze the flow into an :class:`~fairstream.repair.artifacts.Artifact` of kind ``flow`` (arrays only).

        >>> flow = FlowPreprocessor.identity(3, n_blocks=1, hidden=(2,))
        >>> copy = FlowPreprocessor.from_artifact(artifacts.decode(artifacts.encode(flow.to_artifact())))
        >>> copy.n_features, copy.hidden, copy.groups.tolist()
        (3, (2,), [0, 1])
        """
        return artifacts.pack(ARTIFACT_KIND, self._arrays(), parameters=self.artifact_parameters(),
                              metrics=metrics or {}, data_fingerprint=data_fingerprint, version=version)

    def _arrays(self) -> dict[str, np.ndarray]:
        """The flow's arrays by their artifact names."""
        arrays = {"groups": self.groups, "mean": self.mean, "scale": self.scale, "masks": self.masks,
                  "data_min": self.data_min, "data_max": self.data_max}
        for net in NETS:
            for j, (w, b) in enumerate(zip(getattr(self, f"{net}_weights"), getattr(self, f"{net}_biases"))):
                arrays[f"{net}_w{j}"], arrays[f"{net}_b{j}"] = w, b
        return arrays

    @staticmethod
    def array_layout(parameters: dict) -> ArrayLayout:
        """The arrays of a ``flow`` artifact: dtype, shape and value domain of each, checked at load.

        Dimensions: ``n_features`` (the column names), ``n_groups``, ``n_layers`` = 2 ``n_blocks``,
        the flows (one per group when group-aware, else 1) and the coupling nets' sizes
        ``n_features, *hidden, n_features``.
        """
        what = "flow artifact"
        n_blocks = int_parameter(parameters, "n_blocks", what)
        widths = sizes_parameter(parameters, "hidden", what)
        hidden = {f"hidden_{k + 1}": width for k, width in enumerate(widths)}
        if not isinstance(parameters.get("group_aware"), bool):
            raise artifacts.ArtifactError(f"{what}: parameter 'group_aware' must be true or false, "
                                          f"got {parameters.get('group_aware')!r}")
        n_flows = "n_groups" if parameters["group_aware"] else 1
        stack = (n_flows, "n_layers")
        sizes = ["n_features", *hidden, "n_features"]  # hidden sizes by name: hidden_1, ...
        layers = tuple(ArraySpec(f"{net}_{part}{j}", "f", stack + shape, (finite(),)) for net in NETS
                       for j, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:]))
                       for part, shape in (("w", (n_out, n_in)), ("b", (n_out,))))
        feature = ("n_features",)
        return ArrayLayout((
            ArraySpec("groups", "iufU", ("n_groups",), (nonempty(), sorted_labels())),
            ArraySpec("mean", "f", feature, (finite(),)),
            ArraySpec("scale", "f", feature, (finite(), above(0.0))),
            ArraySpec("masks", "f", ("n_layers", "n_features"), (one_of(0.0, 1.0),)),
            ArraySpec("data_min", "f", feature, (not_nan(),)),
            ArraySpec("data_max", "f", feature, (not_nan(), _at_least_data_min())),
            *layers,
        ), dims={**names_parameter(parameters, "columns", what), "n_layers": 2 * n_blocks, **hidden})

    @classmethod
    def from_artifact(cls, artifact: artifacts.Artifact) -> "FlowPreprocessor":
        """Rebuild the frozen flow; every array is checked against :meth:`array_layout` first.

        Parameters
        ----------
        artifact : Artifact
            An artifact of kind ``flow``.

        Returns
        -------
        FlowPreprocessor
            The frozen module.
        """
        if artifact.kind != ARTIFACT_KIND:
            raise artifacts.ArtifactError(f"expected an artifact of kind {ARTIFACT_KIND!r}, got {artifact.kind!r}")
        params, a = artifact.parameters, artifact.arrays
        check_arrays(a, cls.array_layout(params), "flow artifact")
        nets = {net: tuple(tuple(np.array(a[f"{net}_{part}{j}"]) for j in range(len(params["hidden"]) + 1))
                           for part in ("w", "b")) for net in NETS}
        return cls(columns=tuple(column_names(len(a["mean"]), params["columns"])), groups=np.array(a["groups"]),
                   group_aware=params["group_aware"], mean=np.array(a["mean"]), scale=np.array(a["scale"]),
                   masks=np.array(a["masks"]), scale_weights=nets["scale"][0], scale_biases=nets["scale"][1],
                   shift_weights=nets["shift"][0], shift_biases=nets["shift"][1],
                   data_min=np.array(a["data_min"]), data_max=np.array(a["data_max"]),
                   named=params["columns"] is not None, training=dict(params.get("training", {})))


def _frozen(value, numeric: bool) -> np.ndarray:
    array = np.array(value, dtype=np.float64 if numeric else None)  # a private copy
    if array.dtype.kind == "O":
        raise artifacts.ArtifactError("flow arrays must hold numbers or strings, not objects")
    array.flags.writeable = False
    return array


def _tanh(x: np.ndarray) -> np.ndarray:
    """tanh as ``1 - 2 / (exp(2x) + 1)``: numpy's float64 tanh is 3-4x slower than its exp on AVX2.

    Inputs are clipped to +-20, where tanh is 1 to double precision, so exp cannot overflow; the
    absolute error is at the rounding level, which is what the coupling layer's ``exp`` needs.
    """
    e = np.exp(2.0 * np.clip(x, -20.0, 20.0))
    e += 1.0
    return 1.0 - 2.0 / e


def _check_shapes(flow: FlowPreprocessor) -> None:
    """The constructor's check: the flow's own arrays against its layout, with the sizes they imply."""
    sizes = [np.shape(w)[2] if np.ndim(w) == 4 else 0 for w in flow.scale_weights[:-1]]
    parameters = {"columns": list(flow.columns), "group_aware": bool(flow.group_aware),
                  "n_blocks": max(1, np.shape(flow.masks)[0] // 2 if np.ndim(flow.masks) else 1), "hidden": sizes}
    check_arrays(flow._arrays(), FlowPreprocessor.array_layout(parameters), "flow")


def _at_least_data_min() -> Check:
    return Check("at least data_min", lambda high, ctx: (~(high >= ctx.arrays["data_min"]), high))


# ---------------------------------------------------------------------------------------------
# validation of (flow + scorer) on a labelled holdout


@dataclass(frozen=True)
class FlowValidation:
    """Accuracy and fairness gaps of decisions ``1[score >= threshold]`` on a labelled holdout.

    ``dp_gap`` is the spread (max - min) of positive rates across groups, ``eopp_gap`` the same
    among rows with ``y = 1``, ``eo_gap`` the larger of the spreads among ``y = 1`` and ``y = 0``.
    Rows the flow cannot map (unknown group, NaN) are left out and counted in ``n_refused``.
    """

    accuracy: float
    dp_gap: float
    eopp_gap: float
    eo_gap: float
    positive_rates: dict
    n_rows: int
    n_refused: int

    def as_metrics(self) -> dict:
        """JSON-ready metrics for an artifact manifest (gaps that could not be measured are left out)."""
        values = {"accuracy": self.accuracy, "dp_gap": self.dp_gap, "eopp_gap": self.eopp_gap,
                  "eo_gap": self.eo_gap, "n_rows": self.n_rows, "n_refused": self.n_refused}
        return {k: v for k, v in values.items() if not (isinstance(v, float) and np.isnan(v))}


def scorer_probabilities(scorer, X: np.ndarray) -> np.ndarray:
    """Pr[y = 1 | x] from a scorer with ``predict_proba`` (numpy), or from a torch module returning logits."""
    if hasattr(scorer, "predict_proba"):
        return np.asarray(scorer.predict_proba(X), dtype=np.float64).reshape(len(X), -1)[:, -1]
    if callable(scorer):
        import torch  # only a torch scorer pulls torch in

        dtype = next((p.dtype for p in scorer.parameters()), torch.float32) if hasattr(scorer, "parameters") \
            else torch.float64
        with torch.inference_mode():
            logits = scorer(torch.as_tensor(X, dtype=dtype))
        return torch.sigmoid(logits.reshape(len(X))).double().numpy()
    raise TypeError(f"a scorer needs predict_proba(X) or must be a torch module returning logits, "
                    f"got {type(scorer).__name__}")


def _spread(decision: np.ndarray, codes: np.ndarray, n_groups: int, rows: np.ndarray) -> tuple[float, np.ndarray]:
    totals = np.bincount(codes[rows], minlength=n_groups)
    positives = np.bincount(codes[rows], weights=decision[rows], minlength=n_groups)
    present = totals > 0
    rates = np.divide(positives, totals, out=np.full(n_groups, np.nan), where=present)
    gap = float(np.nanmax(rates) - np.nanmin(rates)) if present.sum() >= 2 else float("nan")
    return gap, rates


def validate_flow(flow: FlowPreprocessor | None, scorer, X, s, y, threshold: float = 0.5) -> FlowValidation:
    """DP/EO gaps and accuracy of ``scorer(flow(x))`` on a labelled holdout (``flow=None``: the scorer alone).

    A re-fit job calls it on the same holdout for the active and the candidate flow and compares.

    >>> import numpy as np
    >>> class Half:  # scores 0.9 for the first feature > 0, else 0.1
    ...     def predict_proba(self, X): return np.where(X[:, 0] > 0, 0.9, 0.1)
    >>> X = np.array([[1.0], [1.0], [-1.0], [1.0]]); s = [0, 0, 1, 1]; y = [1, 0, 0, 1]
    >>> result = validate_flow(None, Half(), X, s, y)
    >>> result.accuracy, result.dp_gap, result.positive_rates
    (0.75, 0.5, {0: 1.0, 1: 0.5})
    """
    X = as_2d(X, n_features=None if flow is None else flow.n_features, columns=None if flow is None else flow.columns)
    n = len(X)
    s = normalise_labels(as_labels(s, n, "s"))
    y = as_binary(y, n)
    if flow is None:
        ok, mapped = np.isfinite(X).all(axis=1), X
    else:
        result = flow.map_rows(X, s)
        ok, mapped = result.ok, result.X
    rows = np.flatnonzero(ok)
    score = np.full(n, np.nan)
    score[rows] = scorer_probabilities(scorer, mapped[rows])
    decision = (score >= threshold).astype(np.float64)
    groups, codes = np.unique(s, return_inverse=True)
    dp, rates = _spread(decision, codes, len(groups), rows)
    eopp, _ = _spread(decision, codes, len(groups), rows[y[rows] == 1])
    eo_negative, _ = _spread(decision, codes, len(groups), rows[y[rows] == 0])
    eo = max(eopp, eo_negative) if not np.isnan(eopp + eo_negative) else float("nan")
    return FlowValidation(
        accuracy=float(np.mean(decision[rows] == y[rows])) if len(rows) else float("nan"),
        dp_gap=dp, eopp_gap=eopp, eo_gap=eo,
        positive_rates={g.item(): float(r) for g, r in zip(groups, rates) if not np.isnan(r)},
        n_rows=len(rows), n_refused=int(n - len(rows)),
    )
