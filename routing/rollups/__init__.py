"""The charts' history: GPU, engine, pool and tenant series kept in PostgreSQL as downsampled rollups.

`stats` has the numbers a bucket keeps and how buckets combine; `services` writes 10 s points from the
live records and the request log (one bulk insert per beat tick), aggregates them to 1 min and 1 h,
and prunes each resolution past its retention; `series` reads a subject's series for a time range.
docs/monitoring.md "History" has the whole picture.
"""
