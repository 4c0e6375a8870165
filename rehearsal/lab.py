"""A lab system: it uploads a drop into its lab's landing prefix with its own IAM user, as
docs/drop-protocol.md asks (the data files first, `manifest.json` last, naming each file's size
and sha256). Its user may write there and nowhere else (rehearsal/stack.py)."""

from __future__ import annotations

import hashlib
import json

from rehearsal.account import PREFIX, lab_bucket
from rehearsal.stack import Stack


def upload_drop(stack: Stack, lab: str, drop_id: str, files: dict[str, bytes], **fields: str) -> str:
    """Upload a complete drop as `lab`'s system; the landing prefix it went to."""
    s3 = stack.aws.client("s3", stack.uploaders[lab])
    base = f"{PREFIX}/landing/assays/{drop_id}"
    entries = []
    for path, data in files.items():
        s3.put_object(Bucket=lab_bucket(lab), Key=f"{base}/{path}", Body=data)
        entries.append({"path": path, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)})
    manifest = {"drop_id": drop_id, **fields, "files": entries}
    s3.put_object(Bucket=lab_bucket(lab), Key=f"{base}/manifest.json", Body=json.dumps(manifest).encode())
    return f"s3://{lab_bucket(lab)}/{base}"
