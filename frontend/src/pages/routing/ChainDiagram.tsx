// A stage chain drawn left to right: request -> pre-stages -> generate (its pools) -> post-stages -> answer.
// Plain HTML and CSS: a chain is a line with one fork (classify's branches into generate's pools), which
// flex boxes draw well; a graph library would add weight for no layout it needs.
import type { ChainStage } from "../../api/types";
import { describeConditions, describeStage, kindInfo, type ClassifyRule } from "./stageKinds";

type DiagramStage = Pick<ChainStage, "kind" | "name" | "config">;

interface Branch {
  from: string;
  when: string;
  pool: string;
}

function branchesOf(stages: DiagramStage[]): Branch[] {
  const out: Branch[] = [];
  stages.forEach((stage, index) => {
    if (stage.kind !== "classify") return;
    const rules = (stage.config?.rules ?? []) as ClassifyRule[];
    rules.forEach((rule, r) =>
      out.push({
        from: stage.name || `classify${index}`,
        when: `rule ${r + 1}: ${describeConditions(rule.match)}`,
        pool: rule.pool || "(no pool)",
      }),
    );
  });
  return out;
}

function StageBox({ stage, index }: { stage: DiagramStage; index: number }) {
  const known = kindInfo(stage.kind);
  return (
    <div className={`chain-node chain-node-${known ? stage.kind : "other"}`} data-testid="diagram-stage" data-kind={stage.kind}>
      <div className="chain-node-kind">{known?.label ?? stage.kind}</div>
      <div className="chain-node-name">{stage.name || `${stage.kind}${index}`}</div>
      <div className="chain-node-what">{describeStage(stage)}</div>
    </div>
  );
}

const Arrow = () => (
  <span className="chain-arrow" aria-hidden="true">
    →
  </span>
);

/** The chain as boxes and arrows; `compact` is one line of kind names for the chain list. */
export function ChainDiagram({ stages, compact, testId = "chain-diagram" }: { stages: DiagramStage[]; compact?: boolean; testId?: string }) {
  const at = stages.findIndex((s) => s.kind === "generate");
  if (compact) {
    return (
      <span className="chain-compact" data-testid={testId}>
        {stages.map((stage, index) => (
          <span key={index}>
            {index > 0 && <span className="chain-arrow">→</span>}
            <span className={`chain-pill chain-node-${kindInfo(stage.kind) ? stage.kind : "other"}`} title={describeStage(stage)}>
              {stage.kind === "generate" ? `generate (${describeStage(stage)})` : stage.name || stage.kind}
            </span>
          </span>
        ))}
      </span>
    );
  }
  const pre = at >= 0 ? stages.slice(0, at) : stages;
  const post = at >= 0 ? stages.slice(at + 1) : [];
  const generate = at >= 0 ? stages[at] : null;
  const branches = branchesOf(pre);
  const fallback = generate ? describeStage(generate) : "";
  return (
    <div className="chain-diagram" data-testid={testId} role="img" aria-label="Diagram of the chain">
      <div className="chain-end">request</div>
      {pre.map((stage, index) => (
        <span key={`pre-${index}`} className="chain-step">
          <Arrow />
          <StageBox stage={stage} index={index} />
        </span>
      ))}
      <Arrow />
      {generate ? (
        <div className="chain-node chain-node-generate chain-generate" data-testid="diagram-generate">
          <div className="chain-node-kind">Generate</div>
          <div className="chain-node-name">{generate.name || `generate${at}`}</div>
          <ul className="chain-pools">
            {branches.map((branch, index) => (
              <li key={index} data-testid="diagram-branch">
                <span className="muted">{branch.from} {branch.when} →</span> <strong>{branch.pool}</strong>
              </li>
            ))}
            <li data-testid="diagram-branch">
              {branches.length > 0 && <span className="muted">otherwise →</span>} <strong>{fallback}</strong>
            </li>
          </ul>
        </div>
      ) : (
        <div className="chain-node chain-missing" data-testid="diagram-generate">
          no generate step
        </div>
      )}
      {post.map((stage, index) => (
        <span key={`post-${index}`} className="chain-step">
          <Arrow />
          <StageBox stage={stage} index={at + 1 + index} />
        </span>
      ))}
      <Arrow />
      <div className="chain-end">answer</div>
    </div>
  );
}
