"""Alembic's environment for the ledger: migrations run on the connection `upgrade_ledger`
passes in (`config.attributes["connection"]`), inside the transaction it holds the lock in."""

from alembic import context

from control_plane.accounting.migrations import VERSION_TABLE

context.configure(connection=context.config.attributes["connection"], version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
