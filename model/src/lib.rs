//! Model checks of the lock module's own pure code.
