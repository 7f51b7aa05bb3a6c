//! One test per rule and per implementation of a store trait: the rules are async functions
//! of the file that takes a fixture, each fixture an async function building one
//! implementation on a fresh store. `contract!` writes a module per fixture with a test per
//! rule in it, so a failure names both (`postgres::a_settlement_is_billed_once`).

/// `contract! { fixtures { in_process, postgres } rules { rule_a, rule_b } }`, in a test file
/// that defines `async fn in_process() -> F`, `async fn postgres() -> F` and
/// `async fn rule_a(f: F)`, ….
#[macro_export]
macro_rules! contract {
    (fixtures { $($fixture:ident),+ $(,)? } rules $rules:tt) => {
        $( $crate::contract!(@fixture $fixture $rules); )+
    };
    (@fixture $fixture:ident { $($rule:ident),+ $(,)? }) => {
        mod $fixture {
            $(
                #[tokio::test]
                async fn $rule() {
                    super::$rule(super::$fixture().await).await;
                }
            )+
        }
    };
}

/// Who the rules' changes are audited as: the stores need an actor for every change.
pub fn actor() -> store::audit::Actor {
    store::audit::Actor::new(store::audit::ActorKind::Cli, "e2e", None)
}
