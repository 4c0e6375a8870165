"""What an attempt's row learnt later: why it ended (`cause`), the gang (`ranks`, `node`), its
reads (`cache_bytes`, `store_bytes`), whose it was (`tenant`) and the model gateway's figures
(`model`, `tokens_cached`, `cache_hits`). Old rows get each column's default.

A ledger created before Alembic may hold any of these already (they were added one release at a
time, in place): each is added only where it is missing.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TABLE = "ledger_attempts"
TENANT_INDEX = f"ix_{TABLE}_tenant"


def _columns() -> tuple[sa.Column, ...]:
    """Fresh column objects each time (a column belongs to the one table it is added to)."""
    return (
        sa.Column("cause", sa.String(64), nullable=False, server_default=""),
        sa.Column("ranks", sa.Integer, nullable=False, server_default="1"),
        sa.Column("node", sa.String(200), nullable=False, server_default=""),
        sa.Column("cache_bytes", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("store_bytes", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("tenant", sa.String(100), nullable=False, server_default=""),
        sa.Column("model", sa.String(200), nullable=False, server_default=""),
        sa.Column("tokens_cached", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("cache_hits", sa.Integer, nullable=False, server_default="0"),
    )


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    present = {column["name"] for column in inspector.get_columns(TABLE)}
    for column in _columns():
        if column.name not in present:
            op.add_column(TABLE, column)
    if TENANT_INDEX not in {index["name"] for index in inspector.get_indexes(TABLE)}:
        op.create_index(TENANT_INDEX, TABLE, ["tenant"])


def downgrade() -> None:
    op.drop_index(TENANT_INDEX, table_name=TABLE)
    for column in reversed(_columns()):
        op.drop_column(TABLE, column.name)
