"""PostgreSQL: the pool, migrations, the embedded server for local runs, and one module per group of tables."""
