"""The reference central endpoint (``gpuguard hub``): receives host reports and answers fleet questions.

    settings.py  HubSettings (frozen) and its TOML loader
    tokens.py    per-host and reader bearer tokens, stored only as sha256 hashes
    store.py     Store protocol, SQLiteStore and PostgresStore (same tables)
    writer.py    group commit: one writer thread turns concurrent batches into one transaction
    fleet.py     pure fleet answers (hosts, pairing counts, drift) over store rows
    app.py       the FastAPI app: limits, auth, validation, routes
    dashboard/   the web dashboard under /ui/ (queries, HTML rendering, session cookie)
    metrics.py   GET /metrics (prometheus-client)
    alerts.py    alert webhooks: the delivery queue in the database and its delivery thread
    server.py    uvicorn run with graceful shutdown

FastAPI, uvicorn, psycopg and prometheus-client are optional (``pip install 'gpuguard[hub]'``); nothing outside
this package imports them.
"""
