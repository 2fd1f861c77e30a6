// The live feed: one WebSocket to /ws/live/ per hook user, subscribed to the given groups.
// The server joins every socket to "live.fleet"; pass more groups such as "live.host.<name>" or
// "live.deployment.<id>" (see console/consumers.py). Events are whatever producers push with
// core.live.push_live_event(group, event).
import { useEffect, useRef, useState } from "react";

export type LiveEvent = Record<string, unknown> & { type?: string };

export interface LiveStatus {
  connected: boolean;
}

export function liveUrl(): string {
  const scheme = window.location.protocol === "https:" ? "wss" : "ws";
  return `${scheme}://${window.location.host}/ws/live/`;
}

/** Calls `onEvent` for every event of `groups`; reconnects with backoff until the component unmounts. */
export function useLive(groups: string[], onEvent: (event: LiveEvent) => void): LiveStatus {
  const [connected, setConnected] = useState(false);
  const handler = useRef(onEvent);
  handler.current = onEvent;
  const groupsKey = groups.join("\n");

  useEffect(() => {
    const wanted = groupsKey ? groupsKey.split("\n") : [];
    let socket: WebSocket | null = null;
    let closed = false;
    let retry = 0;
    let timer: ReturnType<typeof setTimeout> | undefined;

    const connect = () => {
      socket = new WebSocket(liveUrl());
      socket.onopen = () => {
        retry = 0;
        setConnected(true);
        for (const group of wanted) socket?.send(JSON.stringify({ subscribe: group }));
      };
      socket.onmessage = (message: MessageEvent<string>) => {
        try {
          const event = JSON.parse(message.data) as LiveEvent;
          // Acknowledgements of our own (un)subscribe requests are not events.
          if (event.type === "subscribed" || event.type === "unsubscribed") return;
          handler.current(event);
        } catch {
          /* not JSON: ignore */
        }
      };
      socket.onclose = (close) => {
        setConnected(false);
        // 4401: closed as not signed in. (A refused handshake shows as 1006; the backoff keeps those retries rare,
        // and the page is left for /login at the next API call.)
        if (closed || close.code === 4401) return;
        retry += 1;
        timer = setTimeout(connect, Math.min(30_000, 500 * 2 ** Math.min(retry, 6)));
      };
    };
    connect();
    return () => {
      closed = true;
      if (timer) clearTimeout(timer);
      socket?.close();
    };
  }, [groupsKey]);

  return { connected };
}
