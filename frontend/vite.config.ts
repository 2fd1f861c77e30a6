import { defineConfig } from "vite";
import react from "@vitejs/plugin-react";

// Django serves the built files: index.html for every console path, assets through whitenoise under /static/.
// `npm run dev` serves at / and proxies the API and the live feed to a console on :8000 (make run).
const backend = "http://127.0.0.1:8000";

export default defineConfig(({ command }) => ({
  base: command === "build" ? "/static/" : "/",
  plugins: [react()],
  build: {
    outDir: "dist",
    emptyOutDir: true,
    sourcemap: true,
  },
  server: {
    proxy: {
      "/api": backend,
      "/ws": { target: backend.replace(/^http/, "ws"), ws: true },
    },
  },
}));
