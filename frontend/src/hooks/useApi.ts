import { useCallback, useEffect, useRef, useState } from "react";
import { api, type Query } from "../api/client";

export interface ApiResource<T> {
  data: T | undefined;
  error: unknown;
  loading: boolean;
  /** Fetch again (after a write); keeps showing the old data meanwhile. */
  reload: () => void;
}

/** GETs `path` with `query` whenever either changes; `path` null waits (e.g. for a param). */
export function useApi<T>(path: string | null, query?: Query): ApiResource<T> {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState<unknown>(null);
  const [loading, setLoading] = useState(true);
  const [generation, setGeneration] = useState(0);
  const queryKey = JSON.stringify(query ?? {});
  const latest = useRef(0);

  useEffect(() => {
    if (path === null) return;
    const ticket = ++latest.current;
    setLoading(true);
    api
      .get<T>(path, JSON.parse(queryKey) as Query)
      .then((result) => {
        if (ticket !== latest.current) return; // a newer request superseded this one
        setData(result);
        setError(null);
      })
      .catch((err: unknown) => ticket === latest.current && setError(err))
      .finally(() => ticket === latest.current && setLoading(false));
  }, [path, queryKey, generation]);

  const reload = useCallback(() => setGeneration((n) => n + 1), []);
  return { data, error, loading, reload };
}
