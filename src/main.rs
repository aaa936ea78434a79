fn main() {
    std::process::exit(blobdrive::cli::main());
}
