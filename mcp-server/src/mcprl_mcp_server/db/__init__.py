"""The company database: schema, deterministic seed data and the read-only query layer."""
