"""What a model is shown and how its answer is read, beside the engine: chat templates, thinking switches, tool-call
formats and their grammars' text. Only engine value types come from below (``Model``, ``Grammar``); the engine
takes token ids and constraints."""
from .prompt import chat_prompt, chat_tokens, image_messages, plain_tokens, prompt_tokens, text_of, tool_prompt

__all__ = ["chat_prompt", "chat_tokens", "image_messages", "plain_tokens", "prompt_tokens", "text_of", "tool_prompt"]
