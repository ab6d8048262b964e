"""The cost model's predictions, kept beside the tuning log so a warm compile does not redo them.

Every compile predicts the latency of every distinct candidate kernel before pruning, and each
prediction extracts MetaSchedule's per-store features from the kernel, a large part of a warm
Korch compile. The model is fixed between `--train` runs, so a
prediction depends only on the kernel and the model: the cache maps kernel key -> seconds in
`predictions.json`, stamped with the SHA-256 of the model file. A retrained model (another
hash) starts an empty cache; an unreadable cache is warned about and rebuilt. It holds nothing
that cannot be recomputed, so a lost concurrent update costs only time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence

import tvm

logger = logging.getLogger("korch_tvm.prediction_cache")

CACHE_FILE = "predictions.json"


def file_digest(path: str) -> str:
    with open(path, "rb") as file:
        return hashlib.sha256(file.read()).hexdigest()


class PredictionCache:
    """Predictions of one cost model (identified by `model_digest`) in `directory`."""

    def __init__(self, directory: str, model_digest: str) -> None:
        self.path = os.path.join(directory, CACHE_FILE)
        self.model_digest = model_digest

    def predict_all(self, modules: Mapping[str, tvm.IRModule],
                    predict_many: Callable[[Sequence[tvm.IRModule]], list[float]]
                    ) -> dict[str, float]:
        """Seconds for every key of `modules`: cached, else from `predict_many` (then saved)."""
        known = self._load()
        missing = [key for key in modules if key not in known]
        if missing:
            fresh = dict(zip(missing, predict_many([modules[key] for key in missing])))
            self._save({**self._load(), **fresh})  # another compile may have added some
            known.update(fresh)
        return {key: known[key] for key in modules}

    def _load(self) -> dict[str, float]:
        try:
            with open(self.path, encoding="utf-8") as file:
                content = json.load(file)
            if content.get("cost_model_sha256") != self.model_digest:
                return {}  # predictions of another model: not ours to use
            return {str(key): float(value) for key, value in content["seconds"].items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
            logger.warning("prediction cache %s is unreadable (%s); predicting again",
                           self.path, err)
            return {}

    def _save(self, seconds: Mapping[str, float]) -> None:
        content = {"cost_model_sha256": self.model_digest, "seconds": dict(sorted(seconds.items()))}
        temporary = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(temporary, "w", encoding="utf-8") as file:
                json.dump(content, file, indent=0)
            os.replace(temporary, self.path)
        except OSError as err:  # a read-only log: predictions are simply not kept
            logger.debug("prediction cache %s not written: %s", self.path, err)
