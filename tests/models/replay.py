"""Artifacts and batches in a directory, applied by another process: the conformance suite's determinism check.

No pickle: features and added columns are .npy files, keys and labels JSON (None, int, float or str).
``python -c "from tests.models.replay import replay; replay(directory)"`` writes, next to each saved
example, the outputs of applying its artifact to its batch.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fairstream.models.kinds import load_module
from fairstream.repair import artifacts
from fairstream.repair.protocol import Applied, Batch, PipelineSchema, apply_chain


def save_example(directory: Path, artifact: artifacts.Artifact, batch: Batch) -> None:
    """``artifact`` and ``batch`` in ``directory`` (created)."""
    directory.mkdir(parents=True)
    artifacts.save(artifact, directory / "artifact")
    np.save(directory / "X.npy", batch.X)
    for name, values in batch.added.items():
        np.save(directory / f"added.{name}.npy", values)
    labels = {name: _labels(getattr(batch, name)) for name in ("keys", "s", "u", "y")}
    (directory / "batch.json").write_text(json.dumps({**labels, "impute_s": batch.impute_s,
                                                      "columns": batch.columns}))


def _labels(values) -> dict | None:
    if values is None:
        return None
    values = np.asarray(values)
    return {"values": values.tolist(), "object": values.dtype == object}


def _array(entry: dict | None) -> np.ndarray | None:
    if entry is None:
        return None
    return np.array(entry["values"], dtype=object) if entry["object"] else np.asarray(entry["values"])


def load_batch(directory: Path) -> Batch:
    meta = json.loads((directory / "batch.json").read_text())
    added = {path.name[len("added."):-len(".npy")]: np.load(path) for path in directory.glob("added.*.npy")}
    return Batch(X=np.load(directory / "X.npy"), keys=_array(meta["keys"]), s=_array(meta["s"]), u=_array(meta["u"]),
                 y=_array(meta["y"]), impute_s=meta["impute_s"],
                 columns=None if meta["columns"] is None else tuple(meta["columns"]), added=added)


def save_outputs(directory: Path, outcome: Applied) -> None:
    np.savez(directory / "outputs.npz", X=outcome.X, ok=outcome.ok,
             **{f"column.{name}": values for name, values in outcome.columns.items()})
    (directory / "reasons.json").write_text(json.dumps(outcome.reasons))


def load_outputs(directory: Path) -> tuple[dict, list]:
    with np.load(directory / "outputs.npz", allow_pickle=False) as saved:
        arrays = {name: saved[name] for name in saved.files}
    return arrays, json.loads((directory / "reasons.json").read_text())


def replay(root: str) -> None:
    """For every example saved under ``root``: load its artifact, apply it to its batch, save the outputs."""
    for directory in sorted(Path(root).iterdir()):
        module = load_module(artifacts.load(directory / "artifact"), PipelineSchema())
        save_outputs(directory, apply_chain([module], load_batch(directory)))
