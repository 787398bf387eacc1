//! The one error for a value that makes no sense: it carries the key the value
//! was given under, so a scenario, the service's config and an API body all
//! report `tenant[2].floor` the same way, and the file layer adds file and line.

/// A value out of range or inconsistent with another, under its key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("`{key}` {message}")]
pub struct ValidationError {
    /// Dotted key path, as written in the file (`policy.floor.border`).
    pub key: String,
    /// What is wrong, starting with a verb phrase ("must be positive, got 0").
    pub message: String,
}

impl ValidationError {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> ValidationError {
        ValidationError {
            key: key.into(),
            message: message.into(),
        }
    }

    /// The same error under a parent key: `floor` under `tenant[2]` is `tenant[2].floor`.
    pub fn under(mut self, parent: &str) -> ValidationError {
        if !parent.is_empty() {
            self.key = format!("{parent}.{}", self.key);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_nest_and_show() {
        let e = ValidationError::new("floor", "must be positive, got 0").under("tenant[2]");
        assert_eq!(e.key, "tenant[2].floor");
        assert_eq!(e.to_string(), "`tenant[2].floor` must be positive, got 0");
    }
}
