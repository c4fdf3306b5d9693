"""Chat with the official `openai` SDK, unchanged: one reply, then the same streamed with the usage
in its last chunk (`stream_options={"include_usage": True}`). LORAPLEX_API_KEY: a tenant's key;
LORAPLEX_URL: the server (http://127.0.0.1:8000); the model: a base model or one of your adapters."""

import os
import sys

from openai import OpenAI

client = OpenAI(base_url=os.environ.get("LORAPLEX_URL", "http://127.0.0.1:8000") + "/v1",
                api_key=os.environ["LORAPLEX_API_KEY"])
model = sys.argv[1] if len(sys.argv) > 1 else "SmolLM2-135M-Instruct"
messages = [{"role": "user", "content": "What is the capital of France?"}]

reply = client.chat.completions.create(model=model, messages=messages, max_tokens=64)
print(reply.choices[0].message.content)
print(reply.usage)

stream = client.chat.completions.create(model=model, messages=messages, max_tokens=64, stream=True,
                                        stream_options={"include_usage": True})
for chunk in stream:
    if chunk.choices:  # the last chunk has no choices, only the usage
        print(chunk.choices[0].delta.content or "", end="", flush=True)
    if chunk.usage:
        print(f"\n{chunk.usage}")
