// The live stream (Server-Sent Events) with this page's connection indicator (the run's own
// state is shown apart: verdict.js).
//
// Reconnects by hand, with backoff, from the last frame id seen: the collector reads the
// `after` query parameter, not the Last-Event-ID header a browser would send on its own.

export class LiveStream {
  constructor(url, { onFrame, onAlert, onEnd, indicator }) {
    this.url = url;
    this.onEnd = onEnd;
    this.onFrame = onFrame;
    this.onAlert = onAlert;
    this.indicator = indicator;
    this.after = 0;
    this.backoff = 1000;
    this.source = null;
  }

  start(after = 0) {
    this.after = after;
    this.open();
  }

  open() {
    const sep = this.url.includes("?") ? "&" : "?";
    const es = new EventSource(`${this.url}${sep}after=${encodeURIComponent(this.after)}`);
    this.source = es;
    es.addEventListener("open", () => {
      this.backoff = 1000;
      this.setState("live");
    });
    es.addEventListener("frame", (e) => {
      const data = parse(e.data);
      if (!data) return;
      const id = Number(e.lastEventId);
      if (Number.isInteger(id) && id > this.after) this.after = id;
      this.onFrame(data);
    });
    es.addEventListener("alert", (e) => {
      const data = parse(e.data);
      if (data) this.onAlert(data);
    });
    es.addEventListener("end", (e) => {
      // The collector ended the stream for good (token revoked, run gone): no reconnect.
      const data = parse(e.data);
      this.source = null;
      es.close();
      this.setState("offline");
      if (data && this.onEnd) this.onEnd(data);
    });
    es.addEventListener("error", () => {
      es.close();
      if (this.source !== es) return;
      this.setState("reconnecting");
      setTimeout(() => this.open(), this.backoff);
      this.backoff = Math.min(this.backoff * 2, 15000);
    });
  }

  /** Close for good (e.g. another rank is shown: a new stream replaces this one). */
  stop() {
    const es = this.source;
    this.source = null;
    if (es) es.close();
  }

  setState(state) {
    this.indicator.textContent = state;
    this.indicator.dataset.state = state;
  }
}

function parse(text) {
  try {
    return JSON.parse(text);
  } catch (err) {
    console.warn("unreadable event from the collector", err);
    return null;
  }
}
