// Who is signed in, and what they may do. The API enforces permissions; the UI only hides what would fail.
import { createContext, useCallback, useContext, useEffect, useMemo, useState, type ReactNode } from "react";
import { api, onUnauthenticated } from "./api/client";
import type { Me } from "./api/types";

interface AuthState {
  /** The signed-in user, null when signed out, undefined while the first check runs. */
  me: Me | null | undefined;
  isAdmin: boolean;
  /** Admins and evaluators: for pages whose API sets `evaluator_writable`. */
  canEvaluate: boolean;
  login: (username: string, password: string) => Promise<Me>;
  logout: () => Promise<void>;
}

const AuthContext = createContext<AuthState | null>(null);

export function AuthProvider({ children }: { children: ReactNode }) {
  const [me, setMe] = useState<Me | null | undefined>(undefined);

  useEffect(() => {
    let cancelled = false;
    api
      .get<Me>("/api/auth/me/")
      .then((user) => !cancelled && setMe(user))
      .catch(() => !cancelled && setMe(null)); // signed out, or the API is down: show the login page
    const unsubscribe = onUnauthenticated(() => setMe(null));
    return () => {
      cancelled = true;
      unsubscribe();
    };
  }, []);

  const login = useCallback(async (username: string, password: string) => {
    const user = await api.post<Me>("/api/auth/login/", { username, password });
    setMe(user);
    return user;
  }, []);

  const logout = useCallback(async () => {
    await api.post<null>("/api/auth/logout/");
    setMe(null);
  }, []);

  const value = useMemo<AuthState>(
    () => ({
      me,
      isAdmin: me?.role === "admin",
      canEvaluate: me?.role === "admin" || me?.role === "evaluator",
      login,
      logout,
    }),
    [me, login, logout],
  );
  return <AuthContext.Provider value={value}>{children}</AuthContext.Provider>;
}

export function useAuth(): AuthState {
  const state = useContext(AuthContext);
  if (!state) throw new Error("useAuth must be used inside <AuthProvider>");
  return state;
}
