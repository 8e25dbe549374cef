int main(void){return 0;}
int rf_placeholder_ops;
