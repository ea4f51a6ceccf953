//! The schema, defined once (see the migration list). Filled in by the schema work.
