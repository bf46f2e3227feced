"""Each API's routes and the shapes it answers in: ``openai``, ``anthropic``, ``responses`` and ``llama_server``.
They build on the shared modules beside this package (``answer``, ``http``, ``requests``, ``native_fields``) and never
import each other; each has ``routes(api, server)``, which ``app.ApiServer.app`` calls."""
