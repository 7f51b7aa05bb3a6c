//! Natural batching of ledger writes. Every reserve and settle is a commit, and a commit costs
//! the database far more than the rows it touches: one statement for 16 turns costs about what
//! one statement for one turn does. So calls are queued, and each of a few lanes takes
//! everything queued at the moment it frees up into one statement. An idle system runs each
//! call alone at once (no added wait); a busy one runs bigger batches instead of more commits.
//!
//! A batch holds at most one item per key (the message id): a replayed settle waits for the
//! next batch instead of racing its original in one statement, and items of one key keep
//! their order.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

struct Job<T, R> {
    item: T,
    reply: oneshot::Sender<R>,
}

/// Runs items in batches through `run`, which answers each item in order.
pub struct Coalescer<T, R> {
    jobs: mpsc::UnboundedSender<Job<T, R>>,
}

impl<T, R> Clone for Coalescer<T, R> {
    fn clone(&self) -> Self {
        Self {
            jobs: self.jobs.clone(),
        }
    }
}

impl<T: Send + 'static, R: Send + 'static> Coalescer<T, R> {
    /// Starts the worker: at most `lanes` batches run at once, each of at most `max_batch`
    /// items with distinct `key`s. It stops when the last handle is dropped.
    pub fn spawn<K, F, Fut>(lanes: usize, max_batch: usize, key: K, run: F) -> Self
    where
        K: Fn(&T) -> &str + Send + 'static,
        F: Fn(Vec<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<R>> + Send + 'static,
    {
        let (jobs, queue) = mpsc::unbounded_channel();
        let worker = Worker {
            queue,
            waiting: VecDeque::new(),
            lanes: Arc::new(Semaphore::new(lanes.max(1))),
            max_batch: max_batch.max(1),
            key,
            run: Arc::new(run),
        };
        tokio::spawn(worker.work());
        Self { jobs }
    }

    /// Queues `item` and waits for its answer; `None` if it was never run (the worker has
    /// stopped). Dropping the future before the answer drops the item if its batch has not
    /// started yet.
    pub async fn submit(&self, item: T) -> Option<R> {
        let (reply, answer) = oneshot::channel();
        self.jobs.send(Job { item, reply }).ok()?;
        answer.await.ok()
    }
}

struct Worker<T, R, K, F> {
    queue: mpsc::UnboundedReceiver<Job<T, R>>,
    /// Items whose key was already in a batch, oldest first.
    waiting: VecDeque<Job<T, R>>,
    lanes: Arc<Semaphore>,
    max_batch: usize,
    key: K,
    run: Arc<F>,
}

impl<T, R, K, F, Fut> Worker<T, R, K, F>
where
    T: Send + 'static,
    R: Send + 'static,
    K: Fn(&T) -> &str + Send + 'static,
    F: Fn(Vec<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<R>> + Send + 'static,
{
    async fn work(mut self) {
        loop {
            let Ok(lane) = self.lanes.clone().acquire_owned().await else {
                return;
            };
            if self.waiting.is_empty() {
                match self.queue.recv().await {
                    Some(job) => self.waiting.push_back(job),
                    None => return,
                }
            }
            let batch = self.take_batch();
            let run = self.run.clone();
            tokio::spawn(async move {
                let (items, replies): (Vec<T>, Vec<_>) =
                    batch.into_iter().map(|j| (j.item, j.reply)).unzip();
                let answers = run(items).await;
                for (reply, answer) in replies.into_iter().zip(answers) {
                    // The caller may have given up; its answer then goes nowhere.
                    let _ = reply.send(answer);
                }
                drop(lane);
            });
        }
    }

    /// The waiting items, then whatever is queued, up to `max_batch` with distinct keys; an
    /// item whose key is taken waits (behind any older item of its key) for a later batch.
    fn take_batch(&mut self) -> Vec<Job<T, R>> {
        while let Ok(job) = self.queue.try_recv() {
            self.waiting.push_back(job);
        }
        let mut batch = Vec::new();
        let mut taken = HashSet::new();
        let mut left = VecDeque::new();
        for job in self.waiting.drain(..) {
            if job.reply.is_closed() {
                continue;
            }
            let key = (self.key)(&job.item).to_owned();
            if batch.len() < self.max_batch && !taken.contains(&key) {
                taken.insert(key);
                batch.push(job);
            } else {
                taken.insert(key);
                left.push_back(job);
            }
        }
        self.waiting = left;
        batch
    }
}

#[cfg(test)]
/// Time is paused: a batch's pause passes only once every task waits, so the batching these
/// tests see does not depend on how loaded the machine is.
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    type Batches = Arc<Mutex<Vec<Vec<(String, u32)>>>>;

    /// A coalescer whose batches take `pause` and are recorded.
    fn recording(
        lanes: usize,
        max_batch: usize,
        pause: Duration,
    ) -> (Coalescer<(String, u32), u32>, Batches) {
        let seen: Batches = Arc::default();
        let record = seen.clone();
        let coalescer = Coalescer::spawn(
            lanes,
            max_batch,
            |item: &(String, u32)| item.0.as_str(),
            move |items: Vec<(String, u32)>| {
                record.lock().map(|mut s| s.push(items.clone())).ok();
                async move {
                    tokio::time::sleep(pause).await;
                    items.into_iter().map(|(_, n)| n * 10).collect()
                }
            },
        );
        (coalescer, seen)
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_coalescer_runs_a_call_alone_and_answers_it() {
        let (coalescer, seen) = recording(2, 16, Duration::ZERO);
        assert_eq!(coalescer.submit(("a".into(), 4)).await, Some(40));
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn calls_queued_behind_a_busy_lane_share_one_batch() {
        let (coalescer, seen) = recording(1, 16, Duration::from_millis(50));
        let calls: Vec<_> = (0..9)
            .map(|n| {
                let c = coalescer.clone();
                tokio::spawn(async move { c.submit((format!("k{n}"), n)).await })
            })
            .collect();
        for (n, call) in calls.into_iter().enumerate() {
            assert_eq!(call.await.unwrap(), Some(n as u32 * 10));
        }
        let batches = seen.lock().unwrap();
        assert!(batches.len() < 9, "no batching: {batches:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_never_holds_one_key_twice_and_a_key_keeps_its_order() {
        let (coalescer, seen) = recording(1, 16, Duration::from_millis(20));
        let calls: Vec<_> = (0..6)
            .map(|n| {
                let c = coalescer.clone();
                let key = if n % 2 == 0 { "same" } else { "other" };
                tokio::spawn(async move { c.submit((key.to_owned(), n)).await })
            })
            .collect();
        for call in calls {
            call.await.unwrap();
        }
        let batches = seen.lock().unwrap();
        let mut order = Vec::new();
        for batch in batches.iter() {
            let keys: HashSet<_> = batch.iter().map(|(k, _)| k).collect();
            assert_eq!(keys.len(), batch.len(), "a key twice in {batch:?}");
            order.extend(batch.iter().filter(|(k, _)| k == "same").map(|(_, n)| *n));
        }
        assert_eq!(order, vec![0, 2, 4]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_holds_at_most_max_batch_items() {
        let (coalescer, seen) = recording(1, 3, Duration::from_millis(20));
        let calls: Vec<_> = (0..10)
            .map(|n| {
                let c = coalescer.clone();
                tokio::spawn(async move { c.submit((format!("k{n}"), n)).await })
            })
            .collect();
        for call in calls {
            call.await.unwrap();
        }
        assert!(seen.lock().unwrap().iter().all(|b| b.len() <= 3));
    }

    #[tokio::test(start_paused = true)]
    async fn an_item_whose_caller_gave_up_before_its_batch_started_is_not_run() {
        let (coalescer, seen) = recording(1, 16, Duration::from_millis(100));
        let busy = {
            let c = coalescer.clone();
            tokio::spawn(async move { c.submit(("a".into(), 1)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let gave_up =
            tokio::time::timeout(Duration::from_millis(10), coalescer.submit(("b".into(), 2)))
                .await;
        assert!(gave_up.is_err());
        assert_eq!(busy.await.unwrap(), Some(10));
        assert_eq!(coalescer.submit(("c".into(), 3)).await, Some(30));
        let run: Vec<u32> = seen
            .lock()
            .unwrap()
            .iter()
            .flatten()
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(run, vec![1, 3]);
    }
}
