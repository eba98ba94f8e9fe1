"""PostgreSQL: the pool, migrations, the embedded server for local runs, and the conversation store."""

from core.storage.db import Pool, check_database, create_pool, retry_dropped
from core.storage.embedded import EmbeddedPostgres, start_embedded
from core.storage.migrations import migrate

__all__ = ["EmbeddedPostgres", "Pool", "check_database", "create_pool", "migrate", "retry_dropped", "start_embedded"]
