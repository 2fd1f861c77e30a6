import { useEffect, useRef, type ReactNode } from "react";

interface DialogProps {
  title: string;
  open: boolean;
  onClose: () => void;
  children: ReactNode;
  /** Buttons for the footer; the dialog adds none itself. */
  footer?: ReactNode;
  /** When false, Escape and the backdrop do not close it (e.g. the copy-once key dialog). */
  dismissable?: boolean;
  testId?: string;
  /** Room for side-by-side content (e.g. before/after JSON). */
  wide?: boolean;
}

/** A modal on the native <dialog> element: focus trapping and Escape come from the browser. */
export function Dialog({ title, open, onClose, children, footer, dismissable = true, testId, wide }: DialogProps) {
  const ref = useRef<HTMLDialogElement>(null);

  useEffect(() => {
    const dialog = ref.current;
    if (!dialog) return;
    if (open && !dialog.open) dialog.showModal();
    if (!open && dialog.open) dialog.close();
  }, [open]);

  if (!open) return null;
  return (
    <dialog
      ref={ref}
      className={wide ? "dialog dialog-wide" : "dialog"}
      aria-labelledby="dialog-title"
      data-testid={testId}
      onCancel={(event) => {
        event.preventDefault();
        if (dismissable) onClose();
      }}
      onClick={(event) => {
        if (dismissable && event.target === ref.current) onClose();
      }}
    >
      <div className="dialog-body">
        <h2 id="dialog-title">{title}</h2>
        {children}
      </div>
      {footer && <div className="dialog-footer">{footer}</div>}
    </dialog>
  );
}

interface ConfirmProps {
  title: string;
  open: boolean;
  message: ReactNode;
  confirmLabel: string;
  danger?: boolean;
  busy?: boolean;
  error?: string | null;
  onConfirm: () => void;
  onClose: () => void;
}

/** "Are you sure?" for destructive actions. */
export function ConfirmDialog({ title, open, message, confirmLabel, danger, busy, error, onConfirm, onClose }: ConfirmProps) {
  return (
    <Dialog
      title={title}
      open={open}
      onClose={onClose}
      footer={
        <>
          <button type="button" className="btn" onClick={onClose} disabled={busy}>
            Cancel
          </button>
          <button type="button" className={danger ? "btn btn-danger" : "btn btn-primary"} onClick={onConfirm} disabled={busy}>
            {confirmLabel}
          </button>
        </>
      }
    >
      <p>{message}</p>
      {error && <p className="form-error" role="alert">{error}</p>}
    </Dialog>
  );
}
