import { useCallback, useEffect, useMemo, useState } from "react";
import { Link, useParams } from "react-router-dom";
import { api, errorMessage } from "../../api/client";
import type { Page as ApiPage, SampleMark, ShadowConfig, ShadowPair, ShadowPairPage } from "../../api/types";
import { useAuth } from "../../auth";
import { SelectField } from "../../components/Field";
import { Card, ErrorState, Page } from "../../components/Page";
import { StatusBadge } from "../../components/StatusBadge";
import { Pagination, Table } from "../../components/Table";
import { formatDateTime } from "../../format";
import { useApi } from "../../hooks/useApi";
import { useQueryParams } from "../../hooks/useQueryParams";
import "../evaluations/review.css";
import { MARKS, formatFixed, formatMs } from "../evaluations/review";
import { SampleSideBySide } from "../evaluations/SampleSideBySide";
import { pairItem } from "../evaluations/sideBySide";
import { usePagedReview } from "../evaluations/usePagedReview";
import { useReviewKeys } from "../evaluations/useReviewKeys";
import { formatShare } from "./rollouts";

const PAGE_SIZE = 25;
const FILTERS = ["candidate_version", "differs", "failed", "marked", "ordering"] as const;

/** One alias's shadow pairs: the primary's live answer beside the shadow candidate's, reviewed as an
 *  offline run's samples are (the same side-by-side view, j / k and 1 / 2 / 3). */
export function ShadowPairsPage() {
  const { alias = "" } = useParams();
  const { canEvaluate } = useAuth();
  const query = useQueryParams();
  const filters = useMemo(() => Object.fromEntries(FILTERS.map((name) => [name, query.get(name)])), [query]);
  const offset = Number(query.get("offset") || 0);
  const pairs = useApi<ShadowPairPage>("/api/shadow-pairs/", { alias, ...filters, limit: PAGE_SIZE, offset });
  const configs = useApi<ApiPage<ShadowConfig>>("/api/shadow-configs/", { limit: 200 });
  const config = configs.data?.results.find((c) => c.alias_name === alias);

  return (
    <Page
      title={
        <>
          Shadow pairs · <code>{alias}</code>
        </>
      }
      subtitle={
        <>
          <Link to="/rollouts">← Rollouts</Link>
          {config && (
            <>
              {" "}
              · mirroring {formatShare(config.percent)} to {config.candidate_label}
              {!config.enabled && " (disabled)"}
            </>
          )}
        </>
      }
    >
      <PairsCard config={config} pairs={pairs.data} loading={pairs.loading} error={pairs.error} onRetry={pairs.reload} offset={offset} query={query} canReview={canEvaluate} />
    </Page>
  );
}

interface PairsCardProps {
  config: ShadowConfig | undefined;
  pairs: ShadowPairPage | undefined;
  loading: boolean;
  error: unknown;
  onRetry: () => void;
  offset: number;
  query: ReturnType<typeof useQueryParams>;
  canReview: boolean;
}

function PairsCard({ config, pairs, loading, error, onRetry, offset, query, canReview }: PairsCardProps) {
  const { rows, setSelected, current, count, move, replace } = usePagedReview<ShadowPair>(pairs, offset, PAGE_SIZE, query);
  const [comment, setComment] = useState("");
  const [saving, setSaving] = useState(false);
  const [markError, setMarkError] = useState<string | null>(null);
  const currentId = current?.id;
  const currentComment = current?.comment ?? "";
  useEffect(() => {
    setComment(currentComment);
    setMarkError(null);
  }, [currentId, currentComment]);

  const save = useCallback(
    async (pair: ShadowPair, mark: SampleMark | null) => {
      setSaving(true);
      setMarkError(null);
      const url = `/api/shadow-pairs/${pair.id}/mark/`;
      try {
        // Both answer the pair (its mark empty once cleared).
        const answer = mark === null ? await api.delete<ShadowPair>(url) : await api.post<ShadowPair>(url, { mark, comment });
        replace(answer);
      } catch (err) {
        setMarkError(errorMessage(err));
      } finally {
        setSaving(false);
      }
    },
    [comment, replace],
  );

  useReviewKeys({
    move,
    mark: (mark) => current && void save(current, mark),
    canMark: canReview && !!current && !saving,
  });

  const filter = (name: string) => query.get(name);
  // Candidates offered: the shadow's candidate now, those of the rows shown, and the one filtered on.
  const candidates = new Map<string, string>();
  if (config) candidates.set(String(config.candidate_version), config.candidate_label);
  for (const p of rows) if (p.candidate_version_id !== null) candidates.set(String(p.candidate_version_id), p.candidate_version_label);
  if (filter("candidate_version") && !candidates.has(filter("candidate_version"))) candidates.set(filter("candidate_version"), `version ${filter("candidate_version")}`);

  return (
    <Card title={`Pairs (${count})`} testId="pairs-card">
      <p className="muted">
        Each pair is one live request (from a tenant that consents to mirroring): the answer its client got from the primary, and the shadow candidate&apos;s, scored with the
        evaluation metrics over words.
      </p>
      <div className="filters" data-testid="pair-filters">
        <SelectField
          label="Candidate"
          name="candidate_version"
          value={filter("candidate_version")}
          onChange={(e) => query.set("candidate_version", e.target.value)}
          options={[{ value: "", label: "Any candidate" }, ...[...candidates].map(([value, label]) => ({ value, label }))]}
        />
        <SelectField
          label="Outputs"
          name="differs"
          value={filter("differs")}
          onChange={(e) => query.set("differs", e.target.value)}
          options={[
            { value: "", label: "All" },
            { value: "true", label: "Differ" },
            { value: "false", label: "Identical" },
          ]}
        />
        <SelectField
          label="Shadow candidate"
          name="failed"
          value={filter("failed")}
          onChange={(e) => query.set("failed", e.target.value)}
          options={[
            { value: "", label: "All" },
            { value: "false", label: "Answered" },
            { value: "true", label: "Failed" },
          ]}
        />
        <SelectField
          label="Mark"
          name="marked"
          value={filter("marked")}
          onChange={(e) => query.set("marked", e.target.value)}
          options={[
            { value: "", label: "Any" },
            { value: "none", label: "Not marked" },
            { value: "any", label: "Marked" },
            ...MARKS.map((m) => ({ value: m.value, label: m.label })),
          ]}
        />
        <SelectField
          label="Order"
          name="ordering"
          value={filter("ordering")}
          onChange={(e) => query.set("ordering", e.target.value)}
          options={[
            { value: "", label: "Newest first" },
            { value: "created_at", label: "Oldest first" },
            { value: "chrf", label: "Lowest chrF first" },
          ]}
        />
      </div>
      <p className="muted keys-help">
        <kbd>j</kbd> / <kbd>k</kbd> next / previous pair{canReview && <> · <kbd>1</kbd> <kbd>2</kbd> <kbd>3</kbd> mark same / acceptable / regression</>}
      </p>
      <ErrorState error={error} onRetry={onRetry} />
      <div className="samples-layout">
        <Table
          testId="pairs-table"
          rows={pairs ? rows : undefined}
          loading={loading}
          rowKey={(p) => p.id}
          onRowClick={(p) => setSelected(rows.findIndex((row) => row.id === p.id))}
          rowClassName={(p) => (p.id === currentId ? "row-selected" : undefined)}
          empty={FILTERS.some((name) => filter(name)) ? "No pair matches these filters." : "No pairs mirrored yet."}
          columns={[
            { header: "When", wrap: true, cell: (p) => formatDateTime(p.created_at) },
            { header: "Candidate", wrap: true, cell: (p) => p.candidate_version_label },
            {
              header: "Parts at",
              className: "num",
              cell: (p) =>
                p.candidate_error ? <StatusBadge status="error" label="failed" /> : p.first_divergence ?? <span className="muted">same</span>,
            },
            { header: "chrF", className: "num", cell: (p) => formatFixed(p.chrf, 1) },
            { header: "Latency", className: "num", priority: 1, cell: (p) => `${formatMs(p.primary_latency_ms)} → ${formatMs(p.candidate_latency_ms)}` },
            {
              header: "Mark",
              cell: (p) => (p.mark ? <StatusBadge status={p.mark} tone={MARKS.find((m) => m.value === p.mark)?.tone} /> : <span className="muted">—</span>),
            },
          ]}
          pagination={count > PAGE_SIZE ? <Pagination count={count} limit={PAGE_SIZE} offset={offset} onOffset={(next) => query.set("offset", String(next))} /> : undefined}
        />
        {current ? (
          <SampleSideBySide
            item={pairItem(current)}
            canReview={canReview}
            comment={comment}
            onComment={setComment}
            onMark={(mark) => void save(current, mark)}
            onClear={() => void save(current, null)}
            saving={saving}
            error={markError}
          />
        ) : null}
      </div>
    </Card>
  );
}
