"""The reference central endpoint (``gpuguard hub``): receives host reports and answers fleet questions.

    settings.py        HubSettings (frozen) and its TOML loader; alert_settings.py one alert webhook
    tokens.py          per-host and reader bearer tokens, stored only as sha256 hashes
    store.py           the Store protocol and the SQL store (SQLiteStore, PostgresStore: same tables), over
      rows.py            what the store answers (host state, drift rows, stored events) and its event query
      schema.py          the tables, their version, how rows go in and come out
      host_updates.py    the newest facts per host in a set of events (pure)
      dialects.py        what differs between SQLite and PostgreSQL
      connections.py     the reader pool and the writer's connection
    writer.py          group commit: one writer thread turns concurrent batches into one transaction
    retention.py       old events deleted in small batches, in the background
    fleet.py           pure fleet answers (hosts, pairing counts, drift) over store rows
    app.py             the FastAPI app: limits, auth, validation, routes
    dashboard/         the web dashboard under /ui/ (queries, HTML rendering, session cookie)
    metrics.py         GET /metrics (prometheus-client)
    alerts.py          alert webhooks: the delivery queue in the database and its delivery thread
    server.py          uvicorn run with graceful shutdown and worker processes; timeouts.py cuts off slow clients

FastAPI, uvicorn, psycopg and prometheus-client are optional (``pip install 'gpuguard[hub]'``); nothing outside
this package imports them.
"""
