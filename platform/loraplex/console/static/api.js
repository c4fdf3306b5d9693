// Calls to the platform's REST routes (the same ones the `loraplex` CLI uses), with the token the
// user signed in with. The token lives in this tab's sessionStorage only: it is sent as the
// bearer token, never put in a URL, and gone when the tab closes or the user signs out.

export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

export class Session {
  constructor(storageKey) {
    this.storageKey = storageKey;
  }

  get token() {
    return sessionStorage.getItem(this.storageKey);
  }

  signIn(token) {
    sessionStorage.setItem(this.storageKey, token.trim());
  }

  signOut() {
    sessionStorage.removeItem(this.storageKey);
  }

  headers(extra = {}) {
    return { Authorization: `Bearer ${this.token}`, ...extra };
  }

  // fetch() with the bearer token; an error status becomes an ApiError carrying the server's
  // own message (OpenAI error body), shown to the user as it is.
  async fetch(path, options = {}) {
    const response = await fetch(path, { ...options, headers: this.headers(options.headers || {}) });
    if (!response.ok) {
      throw await apiError(response);
    }
    return response;
  }

  async json(path, options = {}) {
    return (await this.fetch(path, options)).json();
  }

  async send(method, path, body) {
    return this.json(path, {
      method,
      headers: { "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  }
}

export async function apiError(response) {
  const text = await response.text();
  let body = null;
  let message = text || response.statusText;
  try {
    body = JSON.parse(text);
    if (body && body.error && body.error.message) message = body.error.message;
  } catch (e) {
    // not JSON: the text as it is
  }
  return new ApiError(response.status, message, body);
}

// POST /v1/chat/completions with stream: true, read as SSE over fetch (EventSource cannot send
// a bearer token). Calls onDelta(text) per content piece; returns the final usage if sent.
export async function streamChat(session, { model, messages, maxTokens, signal, onDelta }) {
  const response = await session.fetch("/v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
    body: JSON.stringify({
      model, messages, max_tokens: maxTokens, stream: true, stream_options: { include_usage: true },
    }),
    signal,
  });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let usage = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return usage;
        const chunk = JSON.parse(data);
        if (chunk.error) {
          throw new ApiError(chunk.error.code || 500, chunk.error.message || "stream error", chunk);
        }
        if (chunk.usage) usage = chunk.usage;
        for (const choice of chunk.choices || []) {
          if (choice.delta && choice.delta.content) onDelta(choice.delta.content);
        }
      }
    }
  }
  return usage;
}

// A response body saved as a file (the CSV and billing downloads): fetched with the bearer
// token, then handed to the browser as a blob, so the token never goes into a link.
export async function download(session, path, fallbackName) {
  const response = await session.fetch(path);
  const disposition = response.headers.get("Content-Disposition") || "";
  const match = /filename="([^"]+)"/.exec(disposition);
  const blob = await response.blob();
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = match ? match[1] : fallbackName;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
  return blob;
}
