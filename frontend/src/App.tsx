import { BrowserRouter, Navigate, Route, Routes, useLocation } from "react-router-dom";
import { AuthProvider, useAuth } from "./auth";
import { DatabaseBanner } from "./components/DatabaseBanner";
import { Layout } from "./components/Layout";
import { LoginPage } from "./pages/login/LoginPage";
import { NotFoundPage } from "./pages/placeholder/NotFoundPage";
import { routes } from "./routes";

/** Pages inside the layout need a session; without one, go to the login page and come back after. */
function RequireSession() {
  const { me } = useAuth();
  const location = useLocation();
  if (me === undefined) return <div className="splash">Loading…</div>;
  if (me === null) {
    const next = location.pathname + location.search;
    return <Navigate to={`/login?next=${encodeURIComponent(next)}`} replace />;
  }
  return <Layout />;
}

export function App() {
  return (
    <AuthProvider>
      <DatabaseBanner />
      <BrowserRouter>
        <Routes>
          <Route path="/login" element={<LoginPage />} />
          <Route element={<RequireSession />}>
            {routes.map((route) =>
              route.path === "" ? (
                <Route key="index" index element={route.element} />
              ) : (
                <Route key={route.path} path={route.path} element={route.element} />
              ),
            )}
            <Route path="*" element={<NotFoundPage />} />
          </Route>
        </Routes>
      </BrowserRouter>
    </AuthProvider>
  );
}
