"""The ledger table as the first ledgers had it: every column added later (the ones with a
server default) is missing.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TABLE = "ledger_attempts"
# Frozen here: a migration describes the schema of its day, not what the code holds now.
LOST_REASONS = ("preemption", "failure", "queueing", "rework")
INDEXED = ("run_id", "provider", "started_at", "project", "lane")


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("step", sa.String(200), nullable=False),
        sa.Column("asset", sa.String(300), nullable=False),
        sa.Column("partition", sa.String(300)),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("pool", sa.String(200), nullable=False),
        sa.Column("provider", sa.String(100), nullable=False),
        sa.Column("region", sa.String(100), nullable=False),
        sa.Column("backend", sa.String(32), nullable=False),
        sa.Column("purchasing", sa.String(32), nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("allocated_seconds", sa.Float, nullable=False),
        sa.Column("productive_seconds", sa.Float, nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("exit_code", sa.Integer),
        sa.Column("price_per_gpu_hour", sa.Float, nullable=False),
        sa.Column("project", sa.String(200), nullable=False),
        sa.Column("lane", sa.String(100), nullable=False),
        sa.Column("checkpoint_seconds", sa.Float, nullable=False),
        sa.Column("queue_seconds", sa.Float, nullable=False),
        *(sa.Column(f"lost_{reason}_seconds", sa.Float, nullable=False) for reason in LOST_REASONS),
        sa.Column("tokens_in", sa.BigInteger),
        sa.Column("tokens_out", sa.BigInteger),
        sa.Column("token_cost_usd", sa.Float),
        sa.Column("task_id", sa.String(700), nullable=False),
        sa.Column("completed_task", sa.Boolean, nullable=False),
        sa.Column("gpu_hours", sa.Float, nullable=False),
        sa.Column("gpu_cost_usd", sa.Float, nullable=False),
        sa.Column("cost_usd", sa.Float, nullable=False),
        sa.UniqueConstraint("run_id", "step", "attempt", "started_at", name="uq_ledger_attempt"),
    )
    for column in INDEXED:
        op.create_index(f"ix_{TABLE}_{column}", TABLE, [column])


def downgrade() -> None:
    op.drop_table(TABLE)
