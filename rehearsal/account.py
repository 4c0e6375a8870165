"""The rehearsal's cloud account, on the S3 API server (moto, IAM and KMS enforced): buckets,
identities, keys and the queue new drops are announced on, as deploy/tenancy/ sets them up in a
customer's account.

- Bucket `platform` holds the platform's root, `dagster-logs` the step logs, and `lab-a-data`,
  `lab-b-data` each lab's root, sealed with the lab's own KMS key.
- The control plane signs as its own IAM user: the platform's buckets, the labs' roots (it
  ingests, validates and registers a lab's data) and the drop queue. Each lab's workloads sign as
  that lab's user (the tenants catalog names its credentials), allowed its own bucket only; each
  lab's system uploads as a user allowed `PutObject` under its landing prefix only.
- The robot site (the teleop rig and the robot cell, one company's machines) uploads as a user
  allowed to write the Robotics lane's landing zones and read the platform's root (the robot cell
  fetches the policy checkpoint and the evaluation requests it answers).
- Every bucket announces each `manifest.json` created under a landing zone on that kind's SQS
  queue (`sinewgrid-drops-assays` for the labs' plates, `sinewgrid-drops-teleop` and
  `sinewgrid-drops-robot_eval` for the robot site's drops), with deploy/tenancy/'s own
  notification and queue policy; the landing sensors read the queues instead of listing the zones
  (control_plane/intake/drop_events.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.aws_server import AwsServer, Principal

REPO = Path(__file__).resolve().parent.parent
TENANCY = REPO / "deploy" / "tenancy"
LABS = ("lab-a", "lab-b")
PLATFORM_BUCKET, LOG_BUCKET = "platform", "dagster-logs"
PREFIX = "rehearsal"  # every root's prefix in its bucket
# Each kind of drop (its landing zone's folder, and its queue) and the buckets it lands in.
DROP_KINDS = {"assays": tuple(f"{lab}-data" for lab in LABS), "teleop": (PLATFORM_BUCKET,), "robot_eval": (PLATFORM_BUCKET,)}
EXAMPLE_ACCOUNT, EXAMPLE_BUCKET, EXAMPLE_PREFIX = "111122223333", "lab-a-sinewgrid", "data/"  # what deploy/tenancy/'s files name


def lab_bucket(lab: str) -> str:
    return f"{lab}-data"


def lab_root(lab: str) -> str:
    """A lab's storage root, in its own bucket."""
    return f"s3://{lab_bucket(lab)}/{PREFIX}"


def env_name(lab: str) -> str:
    """The prefix of a lab's credentials' variables (LAB_A_AWS_ACCESS_KEY_ID, ...)."""
    return lab.upper().replace("-", "_")


@dataclass(frozen=True)
class Account:
    control_plane: Principal
    tenants: dict[str, Principal]  # each lab's workloads: its own bucket and key only
    keys: dict[str, str]  # each lab's KMS key id
    uploaders: dict[str, Principal]  # each lab system: its landing prefix only
    robot_site: Principal  # the teleop rig and the robot cell: the Robotics landing zones
    drop_queues: dict[str, str]  # kind -> the SQS queue's URL its buckets announce new drops on

    def tenants_catalog(self, aws: AwsServer) -> dict[str, Any]:
        return {
            "tenants": {
                lab: {
                    "lane": "cell",
                    "storage": lab_root(lab),
                    "credentials": {"env": env_name(lab)},
                    "key": {"kind": "aws-kms", "key_id": self.keys[lab], "endpoint": aws.endpoint, "region": "us-east-1"},
                }
                for lab in LABS
            }
        }

    def credentials_env(self) -> dict[str, str]:
        """Each lab's workload credentials under its catalog name, for the control plane to hand on."""
        env: dict[str, str] = {}
        for lab, principal in self.tenants.items():
            env[f"{env_name(lab)}_AWS_ACCESS_KEY_ID"] = principal.access_key_id
            env[f"{env_name(lab)}_AWS_SECRET_ACCESS_KEY"] = principal.secret_access_key
        return env


def _control_plane_policy(queue_arns: list[str]) -> list[dict[str, Any]]:
    """The control plane's own IAM user (deploy/tenancy/iam-control-plane-policy.json in a
    customer's account): the platform's buckets, each lab's root, and reading the drop queues."""
    buckets = (PLATFORM_BUCKET, LOG_BUCKET, *map(lab_bucket, LABS))
    return [
        {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
         "Resource": [f"arn:aws:s3:::{b}/*" for b in buckets]},
        {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:HeadBucket"], "Resource": [f"arn:aws:s3:::{b}" for b in buckets]},
        # A DeleteObjects call (s3fs's `rm` of several keys: retention, drains) is authorized by moto as
        # s3:DeleteObject on the bucket's ARN; AWS checks s3:DeleteObject per key, which the grant above gives.
        {"Effect": "Allow", "Action": ["s3:DeleteObject"], "Resource": [f"arn:aws:s3:::{b}" for b in buckets]},
        # sqs:DeleteMessageBatch: moto's own name for the batch call, which AWS authorizes with sqs:DeleteMessage.
        {"Effect": "Allow", "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:DeleteMessageBatch", "sqs:GetQueueAttributes"], "Resource": queue_arns},
    ]


def _robot_site_policy() -> list[dict[str, Any]]:
    """The robot site's user: it writes the Robotics landing zones and reads the platform's root."""
    root = f"arn:aws:s3:::{PLATFORM_BUCKET}/{PREFIX}"
    return [
        {"Effect": "Allow", "Action": ["s3:PutObject", "s3:AbortMultipartUpload"], "Resource": [f"{root}/landing/teleop/*", f"{root}/landing/robot_eval/*"]},
        {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [f"{root}/*"]},
        {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:HeadBucket"], "Resource": [f"arn:aws:s3:::{PLATFORM_BUCKET}"]},
    ]


def _uploader_policy(lab: str) -> list[dict[str, Any]]:
    """A lab system's IAM user: it writes under its landing prefix, and reads nothing else."""
    return [{"Effect": "Allow", "Action": ["s3:PutObject", "s3:AbortMultipartUpload"],
             "Resource": [f"arn:aws:s3:::{lab_bucket(lab)}/{PREFIX}/landing/*"]}]


def _tenancy_file(name: str, account: str, **replace: str) -> str:
    """One of deploy/tenancy/'s files with its example account (and any other example) replaced."""
    text = (TENANCY / name).read_text().replace(EXAMPLE_ACCOUNT, account)
    for example, value in replace.items():
        text = text.replace(example, value)
    return text


def _announce_drops(aws: AwsServer, kind: str, buckets: tuple[str, ...]) -> tuple[str, str]:
    """One kind's drop queue, its policy (only `buckets` may send) and each bucket's notification
    of that kind's manifests, from deploy/tenancy/'s files; the queue's URL and ARN."""
    sqs = aws.client("sqs", aws.admin)
    url = sqs.create_queue(QueueName=f"sinewgrid-drops-{kind}", Attributes={"MessageRetentionPeriod": str(14 * 86400)})["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    account = arn.split(":")[4]
    policy = json.loads(_tenancy_file("sqs-drop-queue-policy.json", account, assays=kind))
    policy["Statement"][0]["Condition"]["ArnEquals"]["aws:SourceArn"] = [f"arn:aws:s3:::{bucket}" for bucket in buckets]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": json.dumps(policy)})
    s3 = aws.client("s3", aws.admin)
    for bucket in buckets:
        notification = json.loads(_tenancy_file("s3-drop-notifications.json", account, assays=kind, **{f'"{EXAMPLE_PREFIX}': f'"{PREFIX}/'}))
        existing = s3.get_bucket_notification_configuration(Bucket=bucket).get("QueueConfigurations", [])
        s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={"QueueConfigurations": existing + notification["QueueConfigurations"]})
    return url, arn


def _drain(sqs: Any, url: str) -> None:
    while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", []):
        for message in messages:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


def provision(aws: AwsServer) -> Account:
    """Buckets, identities, keys and the drop queues, as a customer's account holds them."""
    s3 = aws.client("s3", aws.admin)
    for bucket in (PLATFORM_BUCKET, LOG_BUCKET, *map(lab_bucket, LABS)):
        s3.create_bucket(Bucket=bucket)
    queues = {kind: _announce_drops(aws, kind, buckets) for kind, buckets in DROP_KINDS.items()}
    for url, _ in queues.values():
        _drain(aws.client("sqs", aws.admin), url)  # S3's test events of the new notifications
    tenants = {lab: aws.tenant_principal(f"{lab}-workloads", lab_bucket(lab)) for lab in LABS}
    return Account(
        control_plane=aws.principal("sinewgrid-control-plane", _control_plane_policy([arn for _, arn in queues.values()])),
        tenants=tenants,
        keys={lab: aws.kms_key(tenants[lab], f"{lab}'s key") for lab in LABS},
        uploaders={lab: aws.principal(f"{lab}-lab-system", _uploader_policy(lab)) for lab in LABS},
        robot_site=aws.principal("robot-site", _robot_site_policy()),
        drop_queues={kind: url for kind, (url, _) in queues.items()},
    )


def queue_setting(account: Account) -> Mapping[str, str]:
    """SINEWGRID_DROP_QUEUES for the code servers: each landing sensor reads its kind's queue."""
    return {"SINEWGRID_DROP_QUEUES": ",".join(f"{kind}={url}" for kind, url in account.drop_queues.items())}
