// `sqlx::migrate!` embeds store/migrations at compile time; without this, a new migration file
// alone does not rebuild the crate and the binaries run without it (as sqlx's docs advise).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
