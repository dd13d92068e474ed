use crate::ActionId;

/// Why an action operation failed. Keys are rendered with `Debug` so the
/// error stays independent of the key type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    /// The action was aborted (orphaned, explicitly, or lost in a store
    /// restart) or never existed: it can do nothing more. This is the fence
    /// that stops a zombie slave from committing.
    #[error("{action} was aborted")]
    Aborted { action: ActionId },
    /// Waiting for this lock would close a cycle of waiting actions.
    #[error("{action} would deadlock waiting for {key}")]
    Deadlock { action: ActionId, key: String },
    /// The object is held under an overwrite lock and was not written in
    /// this action: its old state is, by contract, never read.
    #[error("{key} is overwrite-locked by {action} and has no new state yet")]
    NotReadable { action: ActionId, key: String },
    /// A write needs an exclusive lock held by the action or an ancestor.
    #[error("{action} writes {key} without an exclusive lock")]
    NotLocked { action: ActionId, key: String },
    /// An action cannot end while nested actions of it are still running.
    #[error("{action} still has running nested actions")]
    ChildrenActive { action: ActionId },
    /// The action is committing; nothing more may happen inside it.
    #[error("{action} is committing")]
    Committing { action: ActionId },
    /// `commit_nested` on a top-level action or `prepare_commit` on a
    /// nested one.
    #[error("{action} is {actual}, not {expected}")]
    WrongLevel { action: ActionId, expected: &'static str, actual: &'static str },
}

impl ActionError {
    /// Whether retrying the whole top-level action may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ActionError::Aborted { .. } | ActionError::Deadlock { .. })
    }
}
