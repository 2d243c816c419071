//! One render for concurrent misses: the first request for a cold key asks the upstream, the others wait (bounded) for what it stores.
//!
//! The table holds one flight per key being fetched, so it is bounded by the
//! requests in progress. A leader that ends without storing (the answer was
//! not cacheable, too large, or the client went away) lets its followers go
//! to the upstream themselves: they never wait for a second render.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;

use super::{Entry, Key};

/// How a flight ended.
#[derive(Clone)]
pub enum Landed {
    Stored(Arc<Entry>),
    /// Nothing was stored: each follower asks the upstream itself.
    NotStored,
}

type Outcome = Option<Landed>;

/// The fetches under way, by key.
#[derive(Default)]
pub struct Flights(Arc<Mutex<HashMap<Key, watch::Sender<Outcome>>>>);

/// A request's place in the fetch for its key.
pub enum Joined {
    /// The first: fetch, then [`Lead::land`].
    Lead(Lead),
    /// Another is fetching: wait for its outcome.
    Follow(watch::Receiver<Outcome>),
}

impl Flights {
    pub fn join(&self, key: &Key) -> Joined {
        let mut table = self.0.lock();
        if let Some(tx) = table.get(key) {
            return Joined::Follow(tx.subscribe());
        }
        let (tx, _) = watch::channel(None);
        table.insert(key.clone(), tx.clone());
        Joined::Lead(Lead {
            flights: self.0.clone(),
            key: key.clone(),
            tx: Some(tx),
        })
    }

    /// Flights under way (for `GET /cache`).
    pub fn len(&self) -> usize {
        self.0.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The leader's duty: land the flight. Dropped without landing, it lands as `NotStored`.
pub struct Lead {
    flights: Arc<Mutex<HashMap<Key, watch::Sender<Outcome>>>>,
    key: Key,
    tx: Option<watch::Sender<Outcome>>,
}

impl Lead {
    pub fn land(mut self, outcome: Landed) {
        self.finish(outcome);
    }

    fn finish(&mut self, outcome: Landed) {
        if let Some(tx) = self.tx.take() {
            self.flights.lock().remove(&self.key);
            tx.send_replace(Some(outcome));
        }
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        self.finish(Landed::NotStored);
    }
}

/// Waits at most `limit` for the leader; `None` when it took longer (the
/// follower then asks the upstream itself).
pub async fn wait(mut rx: watch::Receiver<Outcome>, limit: Duration) -> Option<Landed> {
    let landed = tokio::time::timeout(limit, rx.wait_for(Option::is_some)).await;
    match landed {
        Ok(Ok(outcome)) => outcome.clone(),
        // The sender went without a word (cannot happen: `Lead` lands on drop).
        Ok(Err(_)) => Some(Landed::NotStored),
        Err(_) => None,
    }
}
