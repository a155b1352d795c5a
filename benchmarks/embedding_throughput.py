"""Embedding-worker throughput at d = 512: the trained Fairness Module against the identity, in one run.

Two measurements, each as a ratio of module to identity measured in the same run:

(a) the worker's batch path in this process (``EmbeddingRepairer.process``: decode the JSON batch,
    apply the module or normalise, encode), batches of 500 vectors;
(b) a real ``fairstream worker`` process on the embedded broker, the input pre-loaded, timed from
    its first to its last output (progress read from its /metrics), once with
    ``artifact = "identity"`` and once with a published module (hidden width 512, the paper's).

Vectors are synthetic unit vectors written with 6 significant digits (about 5 KB per message).

    .venv/bin/python benchmarks/embedding_throughput.py [--vectors 20000] [--dimension 512]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import numpy as np

from fairstream.models.embedding import FairnessModule
from fairstream.streams.config import EmbeddingConfig, adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.registry import Active
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.replay import replay
from fairstream.streams.ops.broker import free_port
from fairstream.streams.ops.kafka_cluster import LOCAL_BROKERS, local_broker
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.topics import ensure_topics
from fairstream.streams.worker.processing import EmbeddingRepairer, SimpleMessage

BATCH = 500


def messages(n: int, dimension: int, prefix: str, seed: int = 0) -> list[tuple[bytes, bytes]]:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, dimension))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return [(f"{prefix}{i}".encode(), ('{"id":"%s%d","group":%d,"vector":[%s]}' % (
        prefix, i, i % 2, ",".join(f"{x:.6g}" for x in v))).encode()) for i, v in enumerate(vectors)]


def trained_like_module(dimension: int, seed: int = 0) -> FairnessModule:
    """A module with the shape of a trained one (the cost of applying it does not depend on its weights)."""
    rng = np.random.default_rng(seed)
    hidden = dimension
    return FairnessModule(w1=rng.normal(0, 0.02, (dimension, hidden)), b1=np.zeros(hidden),
                          w2=rng.normal(0, 0.02, (hidden, dimension)), b2=np.zeros(dimension))


def in_process(config, batch: list[tuple[bytes, bytes]], module) -> float:
    """Vectors/s of the batch path, best of 5 runs of 10 batches."""
    repairer = EmbeddingRepairer(config)
    msgs = [SimpleMessage(v, k) for k, v in batch]
    active = None if module is None else Active("embedding", 1, "0" * 64, None, module)
    best = 0.0
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(10):
            repairer.process(msgs, active)
        best = max(best, 10 * len(msgs) / (time.perf_counter() - start))
    return best


def done(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(v) for v in re.findall(
        r'^fairstream_records_(?:repaired|dead_lettered)_total\{agent="embeddings",pipeline="[^"]*"\} (\S+)$', text,
        re.MULTILINE))


def end_to_end(config, bootstrap: str, run_dir: Path, data, module, timeout: float) -> float:
    """Vectors/s of one worker process from its first to its last output."""
    port = free_port()
    config = config.with_monitor(metrics_port=port)
    ensure_topics(bootstrap, config.topics)
    if module is not None:
        ControlClient(bootstrap, config.topics, ArtifactStore(config.artifact_dir)).publish_sync(module.to_artifact())
    replay(bootstrap, config.topics.embeddings_in, data, progress=False)
    with WorkerProcess(config, bootstrap, run_dir, name=config.topics.prefix) as worker:
        deadline, first = time.monotonic() + timeout, None
        while (count := _safe_done(port)) < len(data):
            if time.monotonic() > deadline or not worker.running:
                raise RuntimeError(f"{count:.0f} of {len(data)} done; worker log:\n{worker.log_tail()}")
            if first is None and count > 0:
                first = (time.monotonic(), count)
            time.sleep(0.05)
        end = time.monotonic()
    return (len(data) - first[1]) / (end - first[0])


def _safe_done(port: int) -> float:
    try:
        return done(port)
    except OSError:
        return 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vectors", type=int, default=20_000)
    parser.add_argument("--dimension", type=int, default=512)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--broker", choices=LOCAL_BROKERS, default="embedded",
                        help="the embedded Tansu broker (default) or a local Apache Kafka started for the run")
    args = parser.parse_args(argv)
    base = adult_config()
    module = trained_like_module(args.dimension)
    results = {}
    batch = messages(BATCH, args.dimension, "b")
    for name, artifact, mod in (("identity", "identity", None), ("module", "embedding", module)):
        config = replace(base, embeddings=EmbeddingConfig(artifact=artifact, dimension=args.dimension,
                                                          batch_size=BATCH))
        results[name] = [in_process(config, batch, mod)]
    with tempfile.TemporaryDirectory(prefix="fairstream-emb-") as tmp, local_broker(args.broker, Path(tmp)) as broker:
        print(f"broker: {broker.description}", flush=True)
        data = messages(args.vectors, args.dimension, "v")
        for name, artifact, mod in (("identity", "identity", None), ("module", "embedding", module)):
            config = replace(base, artifact_dir=str(Path(tmp) / "artifacts"),
                             embeddings=EmbeddingConfig(artifact=artifact, dimension=args.dimension,
                                                        batch_size=BATCH)).with_topics(prefix=f"emb{name}")
            results[name].append(end_to_end(config, broker.bootstrap, Path(tmp), data, mod, args.timeout))
            print(f"  {name}: {results[name][1]:,.0f} vectors/s end to end", flush=True)
    print(f"\nd = {args.dimension}, batches of {BATCH}, {args.vectors:,} vectors end to end")
    print(f"{'':12}{'batch path':>14}{'worker':>12}")
    for name, (path, worker) in results.items():
        print(f"{name:12}{path:14,.0f}{worker:12,.0f}")
    ratio = [m / i for m, i in zip(results["module"], results["identity"])]
    print(f"{'module / id':12}{ratio[0]:14.2f}{ratio[1]:12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
