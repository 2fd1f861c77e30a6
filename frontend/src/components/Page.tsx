import type { ReactNode } from "react";
import { ApiError, errorMessage } from "../api/client";

/** The frame of every page: a title, optional actions on the right, then the content. */
export function Page({ title, subtitle, actions, children }: { title: ReactNode; subtitle?: ReactNode; actions?: ReactNode; children: ReactNode }) {
  return (
    <section className="page">
      <header className="page-header">
        <div>
          <h1>{title}</h1>
          {subtitle && <p className="page-subtitle">{subtitle}</p>}
        </div>
        {actions && <div className="page-actions">{actions}</div>}
      </header>
      {children}
    </section>
  );
}

/** A failed load: "not allowed" for 403, the server's message otherwise. */
export function ErrorState({ error, onRetry }: { error: unknown; onRetry?: () => void }) {
  if (!error) return null;
  const notAllowed = error instanceof ApiError && error.status === 403;
  const notFound = error instanceof ApiError && error.status === 404;
  return (
    <div className={notAllowed ? "notice notice-warn" : "notice notice-bad"} role="alert">
      <strong>{notAllowed ? "Not allowed." : notFound ? "Not found." : "Could not load this."}</strong>{" "}
      {notAllowed ? "Your role does not allow this. Ask an admin if you need access." : errorMessage(error)}
      {onRetry && !notAllowed && !notFound && (
        <button type="button" className="btn btn-small" onClick={onRetry}>
          Retry
        </button>
      )}
    </div>
  );
}

export function Card({ title, actions, children, testId }: { title?: ReactNode; actions?: ReactNode; children: ReactNode; testId?: string }) {
  return (
    <div className="card" data-testid={testId}>
      {(title || actions) && (
        <div className="card-header">
          {title && <h2>{title}</h2>}
          {actions && <div className="card-actions">{actions}</div>}
        </div>
      )}
      <div className="card-body">{children}</div>
    </div>
  );
}
