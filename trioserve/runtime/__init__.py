"""The trio side of trioserve: supervisor, model manager, worker pool."""
