"""The OpenAI-compatible server: ``app.py`` (routes), ``protocol.py`` (requests and answers on the
wire), ``scheduler.py`` (one worker, a bounded queue) and ``metrics.py`` (Prometheus)."""
