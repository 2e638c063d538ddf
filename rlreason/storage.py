"""Files of a run's workdir, which is a local directory or a gs:// URL.

  python -m experiments.grpo --workdir=gs://$BUCKET/grpo/run1

Every file a run writes (config.json, COMMIT, metrics.jsonl, eval_*.json,
report.md, plots) goes through `etils.epath.Path`: the local filesystem
for local paths; for gs:// fsspec's `gcsfs` (or tensorflow's gfile when
tensorflow is installed), which the `tpu` and `gpu` extras of setup.py
install. Checkpoints go through orbax, which handles gs:// itself
(TensorStore). TensorBoard events on gs:// need `google-cloud-storage`
(tensorboardX's writer; also in those extras).

Object stores cannot append to an object: metrics.MetricWriter rewrites
metrics.jsonl on remote workdirs instead of appending.
"""

import io
import json
import os
from typing import Any

from etils import epath


def is_local(path: epath.PathLike) -> bool:
  """False for URLs (gs://, s3://, ...), True for filesystem paths."""
  return "://" not in os.fspath(path)


def write_json(path: epath.PathLike, obj: Any) -> None:
  """json.dump(obj, indent=2) into `path` (local or gs://)."""
  epath.Path(path).write_text(json.dumps(obj, indent=2))


def read_json(path: epath.PathLike) -> Any | None:
  """The JSON in `path`, or None if it does not exist."""
  path = epath.Path(path)
  if not path.exists():
    return None
  return json.loads(path.read_text())


def save_figure(fig, path: epath.PathLike, **savefig_kwargs) -> None:
  """fig.savefig into `path` (local or gs://); the format is its suffix."""
  path = epath.Path(path)
  buf = io.BytesIO()
  fig.savefig(buf, format=path.suffix.lstrip(".") or "png", **savefig_kwargs)
  path.write_bytes(buf.getvalue())
