import { useState, type FormEvent } from "react";
import { Navigate, useNavigate, useSearchParams } from "react-router-dom";
import { useAuth } from "../../auth";
import { FormErrors, InputField } from "../../components/Field";
import { useFormState } from "../../hooks/useFormState";

/** Only same-site paths are followed after login, so `?next=` cannot send anyone elsewhere. */
function safeNext(value: string | null): string {
  return value && value.startsWith("/") && !value.startsWith("//") ? value : "/";
}

export function LoginPage() {
  const { me, login } = useAuth();
  const navigate = useNavigate();
  const [params] = useSearchParams();
  const next = safeNext(params.get("next"));
  const [username, setUsername] = useState("");
  const [password, setPassword] = useState("");
  const { error, busy, run, errors: fieldErrors } = useFormState();

  if (me) return <Navigate to={next} replace />;

  const submit = (event: FormEvent) => {
    event.preventDefault();
    void run(async () => {
      await login(username, password);
      navigate(next, { replace: true });
    });
  };

  return (
    <div className="login-screen">
      <form className="login-card" onSubmit={submit} noValidate>
        <div className="brand brand-login">
          <span className="brand-mark">◆</span> inferchain
        </div>
        <h1>Sign in to the console</h1>
        <InputField
          label="Username"
          name="username"
          autoComplete="username"
          autoFocus
          value={username}
          onChange={(e) => setUsername(e.target.value)}
          errors={fieldErrors}
        />
        <InputField
          label="Password"
          name="password"
          type="password"
          autoComplete="current-password"
          value={password}
          onChange={(e) => setPassword(e.target.value)}
          errors={fieldErrors}
        />
        <FormErrors error={error} fields={["username", "password"]} />
        <button type="submit" className="btn btn-primary btn-block" disabled={busy}>
          {busy ? "Signing in…" : "Sign in"}
        </button>
      </form>
    </div>
  );
}
