"""Each API's request body read into the one job every API runs: ``openai.parse`` reads OpenAI's (and llama-server's)
fields into a ``Job``; ``anthropic`` and ``responses`` turn their APIs' bodies into the chat body it reads."""
