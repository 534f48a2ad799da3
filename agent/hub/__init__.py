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
    app.py             the FastAPI app: routes, refusal handlers, lifespan (writer, alerts, retention)
      api_models.py      the API's bodies (the OpenAPI spec is generated from them)
      responses.py       answers as JSON, and every refusal (HubHTTPError) as {error, detail, problems}
      access.py          which token may call what (401/403)
      middleware.py      ASGI middleware: the body's size limit (413) and deadline (408)
      ingest.py          POST /v1/events: parse, check, queue for the writer (the hot path)
    dashboard/         the web dashboard under /ui/ (queries, HTML rendering, session cookie)
    metrics.py         GET /metrics (prometheus-client)
    alerts.py          alert webhooks: the delivery queue in the database and its delivery thread
    server.py          uvicorn run with graceful shutdown and worker processes; header_timeout.py cuts off slow
                       request headers

FastAPI, uvicorn, psycopg and prometheus-client are optional (``pip install 'gpuguard[hub]'``); nothing outside
this package imports them.
"""
